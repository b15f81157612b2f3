package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
)

// Options configure Open, Migrate and MigrateDown. The zero value is ready to use.
type Options struct {
	// MustExist makes Open fail with an error wrapping ErrNoStore, writing nothing, when the
	// schema holds no toolfence tables yet (or does not exist), instead of creating them: for
	// tools that only look at or maintain a store, so that a DSN naming the wrong database
	// or schema is not turned into a new, empty store. A store that exists but is behind is
	// still migrated unless DisableAutoMigrate is set. Defaults to false.
	MustExist bool
	// DisableAutoMigrate stops Open from applying pending migrations: Open then fails with
	// an error wrapping ErrSchemaOutdated when the database is behind this binary. Defaults
	// to false: Open migrates (under an advisory lock, so concurrent openers do not race).
	DisableAutoMigrate bool
	// MaxConns caps the connection pool. Defaults to the DSN's pool_max_conns, else
	// pgxpool's default (the larger of 4 and the number of CPUs).
	MaxConns int32
	// Schema is the PostgreSQL schema that holds toolfence's tables: it is set as the
	// connections' search_path and created by the migrations when missing. Tests use a
	// schema each for isolation. Defaults to the DSN's search_path, else the server's.
	Schema string
	// Clock paces client-side waits only (backoff between retries, watch reconnects); the
	// database server's clock decides every expiry. With a lease.Fake those waits end only
	// when the test advances it. Defaults to lease.Real.
	Clock lease.Clock
	// TimeOffset is added to the server's clock_timestamp() in every statement. FOR TESTS
	// ONLY: it lets a conformance suite move the ledger's time without sleeping (see
	// Ledger.SetTimeOffset). Production code leaves it zero. Defaults to zero.
	TimeOffset time.Duration
	// ConnectTimeout bounds each connection attempt. Defaults to the DSN's
	// connect_timeout, else 5 s.
	ConnectTimeout time.Duration
	// NotifyAfterCommit sends a write's change notification (see Ledger.Watch) in its own
	// statement right after the write commits, instead of inside the write's transaction.
	// PostgreSQL serialises the commits of notifying transactions through a database-wide
	// lock held across the WAL flush, so while a watch is registered in-transaction
	// notifications turn concurrent writers into a queue; after-commit notifications cost
	// one more round trip per write while watched, and a crash between the commit and the
	// notification loses that notification (watchers re-list after gaps anyway). Defaults
	// to false: notifications commit with their write.
	NotifyAfterCommit bool
	// WriteTimeout bounds a write step (with its retries) once it has started. A write
	// that has started finishes even if the caller's context ends meanwhile, so a
	// cancelled call never leaves a write whose outcome is unknown. Defaults to 10 s.
	WriteTimeout time.Duration
	// AllowAsyncReplicas lets Open proceed when the server streams to standbys and none of
	// them is synchronous (see ErrAsyncReplicas), with a warning on Logger: for a standby
	// that is never promoted (a reporting replica, a delayed backup) or a deployment that
	// accepts losing the last writes on failover. Defaults to false: Open refuses.
	AllowAsyncReplicas bool
	// Logger receives the warning of AllowAsyncReplicas. Defaults to slog.Default().
	Logger *slog.Logger
}

// Sentinel errors of this package; errors returned by Open, Migrate and the ledger's
// methods wrap them where they apply. A server that could not be reached, refused the
// login, or whose database does not exist gives an error wrapping ledger.ErrUnavailable,
// whose message names host, port, database and user, never the password.
var (
	// ErrInvalidDSN: the connection string cannot be parsed. Nothing was contacted.
	ErrInvalidDSN = errors.New("postgres: invalid connection string")
	// ErrSchemaTooNew: the database was migrated by a newer toolfence than this binary
	// knows; nothing was written. Upgrade the binary.
	ErrSchemaTooNew = errors.New("postgres: database schema is newer than this binary")
	// ErrSchemaOutdated: the database needs migrations and automatic migration is off;
	// run `toolfence migrate`.
	ErrSchemaOutdated = errors.New("postgres: database schema is older than this binary")
	// ErrNoStore: Options.MustExist was set and toolfence has no tables in the schema, or
	// the schema the DSN's search_path names does not exist.
	ErrNoStore = errors.New("postgres: no toolfence store there")
)

const (
	defaultConnectTimeout = 5 * time.Second
	defaultWriteTimeout   = 10 * time.Second
)

// Ledger is the PostgreSQL ledger. It is safe for concurrent use by many goroutines and by
// many processes on many machines sharing one database.
type Ledger struct {
	pool  *pgxpool.Pool
	conn  *pgx.ConnConfig // template for dedicated LISTEN connections
	clock lease.Clock
	// writeTimeout bounds a started write; see Options.WriteTimeout.
	writeTimeout time.Duration
	// notifyAfterCommit: see Options.NotifyAfterCommit.
	notifyAfterCommit bool
	offset            atomic.Int64 // µs added to clock_timestamp(); tests only
	schema            string       // current_schema() of the ledger's connections
	target            string       // host:port/database, for error messages
	replication       Replication  // what Open saw of the standbys
	closed            atomic.Bool
	ctx               context.Context // ends on Close; watches derive from it
	cancel            context.CancelFunc
	watches           sync.WaitGroup
	// reserves and commits let concurrent Reserves and Commits share a statement (group).
	reserves *group[*reserveJob]
	commits  *group[*commitJob]
	calls    atomic.Int64 // Reserves and Commits in flight: the groups' load
}

var (
	_ ledger.Ledger  = (*Ledger)(nil)
	_ ledger.Watcher = (*Ledger)(nil)
)

// Open connects to the database at dsn (a postgres:// URL or key=value string), applies
// pending migrations unless opts.DisableAutoMigrate is set, and returns the ledger. It fails
// with an error wrapping ErrInvalidDSN, ledger.ErrUnavailable (naming the host, never the
// password), ErrSchemaTooNew, ErrSchemaOutdated, ErrNoStore, ErrNotDurable or
// ErrAsyncReplicas; on failure nothing stays open.
//
// Every session of the ledger raises synchronous_commit to on (remote_apply is kept)
// whatever the server, database, role or DSN sets, so each write is flushed before it is
// acknowledged, and waits for the synchronous standbys there are. Open then checks, once,
// what no session can change: it refuses fsync = off, full_page_writes = off and
// data_sync_retry = on (ErrNotDurable), and physical standbys none of which is synchronous
// unless opts.AllowAsyncReplicas is set (ErrAsyncReplicas). Standbys that connect after
// Open are not seen.
func Open(ctx context.Context, dsn string, opts Options) (*Ledger, error) {
	cfg, err := poolConfig(dsn, opts)
	if err != nil {
		return nil, err
	}
	target := describe(cfg.ConnConfig)
	repl, err := ensureSchema(ctx, cfg.ConnConfig, opts)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, unavailable(cfg.ConnConfig, err)
	}
	l := &Ledger{pool: pool, conn: cfg.ConnConfig, clock: cmp.Or[lease.Clock](opts.Clock, lease.Real{}),
		writeTimeout: cmp.Or(opts.WriteTimeout, defaultWriteTimeout), notifyAfterCommit: opts.NotifyAfterCommit,
		target: target, replication: repl}
	l.offset.Store(opts.TimeOffset.Microseconds())
	l.reserves, l.commits = newGroup(l.reserveMany, &l.calls), newGroup(l.commitMany, &l.calls)
	var schema *string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		pool.Close()
		return nil, unavailable(cfg.ConnConfig, err)
	}
	if schema == nil {
		pool.Close()
		return nil, fmt.Errorf("%w: %s: no schema of search_path %q exists; run toolfence migrate",
			ErrSchemaOutdated, target, cfg.ConnConfig.RuntimeParams["search_path"])
	}
	l.schema = *schema
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l, nil
}

// ensureSchema checks the server's durability (checkDurability), then migrates (or, with
// DisableAutoMigrate, checks) the schema, on one short-lived connection before the pool is
// built: a server Open refuses gets nothing written.
func ensureSchema(ctx context.Context, cc *pgx.ConnConfig, opts Options) (Replication, error) {
	conn, err := connect(ctx, cc)
	if err != nil {
		return Replication{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	repl, err := checkDurability(ctx, conn, cc, opts.AllowAsyncReplicas, cmp.Or(opts.Logger, slog.Default()))
	if err != nil {
		return repl, err
	}
	return repl, migrateIfNeeded(ctx, conn, cc, opts)
}

// migrateIfNeeded applies or checks the migrations on conn (see ensureSchema).
func migrateIfNeeded(ctx context.Context, conn *pgx.Conn, cc *pgx.ConnConfig, opts Options) error {
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	latest := ms[len(ms)-1].version
	if opts.MustExist || opts.DisableAutoMigrate {
		cur, err := currentVersion(ctx, conn)
		if err != nil {
			return unavailable(cc, err)
		}
		switch {
		case cur == 0 && opts.MustExist:
			return fmt.Errorf("%w: %s has no toolfence tables: nothing has been recorded there (check the DSN, or run toolfence migrate to create the store)",
				ErrNoStore, describe(cc))
		case cur > latest:
			return fmt.Errorf("%w: %s is at migration %d, this binary knows up to %d; upgrade toolfence", ErrSchemaTooNew, describe(cc), cur, latest)
		case cur < latest && opts.DisableAutoMigrate:
			return fmt.Errorf("%w: %s is at migration %d, this binary needs %d; run toolfence migrate", ErrSchemaOutdated, describe(cc), cur, latest)
		case cur == latest || opts.DisableAutoMigrate:
			return nil
		}
	}
	_, _, err = migrateConn(ctx, conn, cc, opts.Schema, latest, false, 0, ms)
	return err
}

// SetTimeOffset sets the offset added to the server clock in every statement of this
// Ledger. FOR TESTS ONLY: conformance suites call it to make leases expire without
// sleeping. It is safe for concurrent use.
func (l *Ledger) SetTimeOffset(d time.Duration) { l.offset.Store(d.Microseconds()) }

// TimeOffset returns the offset set by Options.TimeOffset or SetTimeOffset.
func (l *Ledger) TimeOffset() time.Duration { return time.Duration(l.offset.Load()) * time.Microsecond }

// Now returns the ledger's clock: the database server's clock_timestamp() plus the test-only
// offset. Expiry is decided by this clock, never by the caller's. It fails when the server
// cannot be reached.
func (l *Ledger) Now(ctx context.Context) (time.Time, error) {
	if err := l.check(); err != nil {
		return time.Time{}, err
	}
	var t time.Time
	if err := l.pool.QueryRow(ctx, `SELECT `+now(1), l.offset.Load()).Scan(&t); err != nil {
		return time.Time{}, l.fail("read the clock", false, err)
	}
	return t.UTC(), nil
}

// Schema returns the PostgreSQL schema the ledger's tables live in.
func (l *Ledger) Schema() string { return l.schema }

// Pool returns the ledger's connection pool, for callers that need to run their own SQL in
// the same database (tests, tools that fence their own writes). Do not close it, and do not
// change session settings on its connections (SET, RESET, DISCARD): each connection raised
// synchronous_commit to on when it connected, the ledger's writes rely on it, and nothing
// checks it again on each acquisition (that would cost a round trip per write). Use SET
// LOCAL inside your own transactions instead.
func (l *Ledger) Pool() *pgxpool.Pool { return l.pool }

// Close stops every watch, waits for their goroutines and closes the pool. Later calls
// return lease.ErrClosed. It is safe to call more than once.
func (l *Ledger) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	l.cancel()
	l.watches.Wait()
	l.pool.Close()
	return nil
}

// mode indexes the statement variants of notifyModes.
func (l *Ledger) mode() int {
	if l.notifyAfterCommit {
		return 1
	}
	return 0
}

func (l *Ledger) check() error {
	if l.closed.Load() {
		return lease.ErrClosed
	}
	return nil
}

// poolConfig parses dsn and applies opts.
func poolConfig(dsn string, opts Options) (*pgxpool.Config, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if strings.TrimSpace(dsn) == "" {
		return nil, fmt.Errorf("%w: empty (want postgres://user@host:5432/database)", ErrInvalidDSN)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalidDSN, scrubDSN(dsn, err.Error()))
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	cc := cfg.ConnConfig
	if opts.Schema != "" {
		cc.RuntimeParams["search_path"] = pgx.Identifier{opts.Schema}.Sanitize()
	}
	if _, ok := cc.RuntimeParams["application_name"]; !ok {
		cc.RuntimeParams["application_name"] = "toolfence"
	}
	// Every write and read by key finds its row by primary key (no other index but the open
	// residuals' begins with the namespace, migration 0007): a generic plan is as good as a
	// custom one, and re-planning the multi-statement Reserve on each call costs more than
	// running it.
	if _, ok := cc.RuntimeParams["plan_cache_mode"]; !ok {
		cc.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	}
	// Whatever synchronous_commit the server, database, role or DSN (options=-c …) sets,
	// the session raises it before its first write: see raiseSynchronousCommit.
	if prev := cc.AfterConnect; prev != nil {
		cc.AfterConnect = func(ctx context.Context, pc *pgconn.PgConn) error {
			if err := prev(ctx, pc); err != nil {
				return err
			}
			return raiseSynchronousCommit(ctx, pc)
		}
	} else {
		cc.AfterConnect = raiseSynchronousCommit
	}
	if opts.ConnectTimeout > 0 {
		cc.ConnectTimeout = opts.ConnectTimeout
	} else if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = defaultConnectTimeout
	}
	return cfg, nil
}

// validate rejects settings that cannot mean anything.
func (o Options) validate() error {
	switch {
	case o.MaxConns < 0:
		return fmt.Errorf("%w: postgres: MaxConns %d is negative", ledger.ErrInvalidParams, o.MaxConns)
	case o.ConnectTimeout < 0:
		return fmt.Errorf("%w: postgres: ConnectTimeout %v is negative", ledger.ErrInvalidParams, o.ConnectTimeout)
	case o.WriteTimeout < 0:
		return fmt.Errorf("%w: postgres: WriteTimeout %v is negative", ledger.ErrInvalidParams, o.WriteTimeout)
	}
	return nil
}

func connect(ctx context.Context, cc *pgx.ConnConfig) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cc.Copy())
	if err != nil {
		return nil, unavailable(cc, err)
	}
	return conn, nil
}

// describe names the server of cc without its password: host:port/database as user.
func describe(cc *pgx.ConnConfig) string {
	host := cc.Host
	if !strings.HasPrefix(host, "/") {
		host = net.JoinHostPort(host, strconv.Itoa(int(cc.Port)))
	} else {
		host += ":" + strconv.Itoa(int(cc.Port))
	}
	if sp := cc.RuntimeParams["search_path"]; sp != "" {
		// Options.Schema arrives quoted; show one schema the way a DSN names it.
		if len(sp) > 2 && sp[0] == '"' && sp[len(sp)-1] == '"' && !strings.ContainsAny(sp[1:len(sp)-1], `",`) {
			sp = sp[1 : len(sp)-1]
		}
		return fmt.Sprintf("%s/%s (user %s, search_path %s)", host, cc.Database, cc.User, sp)
	}
	return fmt.Sprintf("%s/%s (user %s)", host, cc.Database, cc.User)
}

// scrubbedError keeps errors.Is/As working on the cause while its text never shows the
// password.
type scrubbedError struct {
	msg    string
	causes []error
}

func (e *scrubbedError) Error() string   { return e.msg }
func (e *scrubbedError) Unwrap() []error { return e.causes }

// unavailable wraps a connection failure in ledger.ErrUnavailable, naming the server.
func unavailable(cc *pgx.ConnConfig, err error) error {
	cause := err
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Unwrap() != nil {
		cause = ce.Unwrap()
	}
	msg := fmt.Sprintf("postgres: cannot use %s: %v: %s", describe(cc), ledger.ErrUnavailable, distinctLines(cause.Error()))
	if cc.Password != "" {
		msg = strings.ReplaceAll(msg, cc.Password, "xxxxx")
	}
	return &scrubbedError{msg: msg, causes: []error{ledger.ErrUnavailable, err}}
}

// distinctLines drops the repeats of a line from s: pgx reports each try of a connection
// (TLS first, then plain, under the default sslmode) on its own line, often word for word.
func distinctLines(s string) string {
	lines := strings.Split(s, "\n")
	out := lines[:0]
	for _, l := range lines {
		if !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

var urlPassword = regexp.MustCompile(`(://[^:/@?#]*:)([^@]*)@`)
var kvPassword = regexp.MustCompile(`(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// scrubDSN removes the password of dsn from msg, as far as it can be recognised.
func scrubDSN(dsn, msg string) string {
	for _, re := range []*regexp.Regexp{urlPassword, kvPassword} {
		for _, m := range re.FindAllStringSubmatch(dsn, -1) {
			if pw := strings.Trim(m[2], "'"); pw != "" {
				msg = strings.ReplaceAll(msg, pw, "xxxxx")
			}
		}
	}
	return msg
}
