package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/toolfence/toolfence/ledger"
)

// Durability errors of Open. A ledger is only as durable as the server under it: these say
// that an acknowledged reservation or commit could be lost, so a call could be dispatched
// twice and a fencing token issued twice.
var (
	// ErrNotDurable: the server runs with a setting under which a commit it acknowledged
	// can be lost in a crash (fsync = off, full_page_writes = off, data_sync_retry = on),
	// or a session of the ledger could not raise synchronous_commit to on. The message
	// names the settings. Open refuses such a server; a session cannot repair it.
	ErrNotDurable = errors.New("postgres: server settings can lose acknowledged writes")
	// ErrAsyncReplicas: the server streams to standbys and none of them is synchronous, so
	// a failover to one of them loses the writes it had not received yet. Open refuses
	// unless Options.AllowAsyncReplicas is set.
	ErrAsyncReplicas = errors.New("postgres: only asynchronous standbys: a failover can lose acknowledged writes")
)

// raiseSQL raises the session's synchronous_commit to on unless it is on or remote_apply
// already (off, local and remote_write acknowledge a commit before it is durable on the
// primary, or before a synchronous standby has flushed it), and returns the value in force.
const raiseSQL = `SELECT set_config('synchronous_commit',
	CASE WHEN current_setting('synchronous_commit') IN ('on', 'remote_apply') THEN current_setting('synchronous_commit') ELSE 'on' END,
	false)`

// raiseSynchronousCommit is every connection's AfterConnect (pool, migrations, watches):
// whatever the server, database, role or DSN default, the ledger's sessions commit with
// synchronous_commit on (or remote_apply, kept). It costs one round trip per new
// connection, none per write. Nothing in this package issues SET or RESET afterwards; see
// Ledger.Pool for callers that run their own SQL.
func raiseSynchronousCommit(ctx context.Context, pc *pgconn.PgConn) error {
	res, err := pc.Exec(ctx, raiseSQL).ReadAll()
	if err != nil {
		return err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return fmt.Errorf("%w: raising synchronous_commit returned no value", ErrNotDurable)
	}
	if v := string(res[0].Rows[0][0]); v != "on" && v != "remote_apply" {
		return fmt.Errorf("%w: synchronous_commit stays %q for this session", ErrNotDurable, v)
	}
	return nil
}

// durabilitySQL reads, in one statement, what checkDurability judges: the settings a
// session cannot change, and the physical standbys this server streams to (a walsender
// that serves a logical replication slot is a subscriber, and one in state 'backup' a base
// backup, neither a failover target). Without pg_read_all_stats a role sees the walsenders
// but not their state or sync_state (NULL).
const durabilitySQL = `SELECT current_setting('synchronous_commit'), current_setting('fsync'),
	current_setting('full_page_writes'), current_setting('data_sync_retry'),
	current_setting('synchronous_standby_names'),
	count(r.pid), count(r.pid) FILTER (WHERE r.sync_state IN ('sync', 'quorum')),
	count(r.pid) FILTER (WHERE r.sync_state IS NULL)
FROM (SELECT 1) one LEFT JOIN pg_stat_replication r ON r.state IS DISTINCT FROM 'backup' AND NOT EXISTS (
	SELECT 1 FROM pg_replication_slots s WHERE s.active_pid = r.pid AND s.slot_type = 'logical')`

// Replication is what Open saw of the server's standbys.
type Replication struct {
	// Standbys is the number of physical standbys connected to the server (its
	// walsenders, less those of logical slots and base backups).
	Standbys int
	// Synchronous is how many of them are synchronous (sync_state sync or quorum).
	Synchronous int
	// Unseen is how many of them hide their sync_state from this role (it lacks
	// pg_read_all_stats); Open takes them as synchronous when synchronous_standby_names
	// is set.
	Unseen int
	// StandbyNames is synchronous_standby_names.
	StandbyNames string
	// SynchronousCommit is the ledger's sessions' synchronous_commit: on or remote_apply.
	SynchronousCommit string
}

// Async reports whether a failover could go to a standby that lacks acknowledged writes:
// there are standbys and none is (or, unseen, may be) synchronous.
func (r Replication) Async() bool {
	if r.Standbys == 0 || r.Synchronous > 0 {
		return false
	}
	return r.Unseen == 0 || strings.TrimSpace(r.StandbyNames) == ""
}

// checkDurability runs durabilitySQL on conn (a session configured like the ledger's) and
// refuses, with ErrNotDurable or ErrAsyncReplicas, a server that can lose acknowledged
// writes.
func checkDurability(ctx context.Context, conn *pgx.Conn, cc *pgx.ConnConfig, allowAsync bool, log *slog.Logger) (Replication, error) {
	target := describe(cc)
	r, fsync, fpw, retry, err := readDurability(ctx, conn)
	if err != nil {
		return r, unavailable(cc, err)
	}
	var bad []string
	if r.SynchronousCommit != "on" && r.SynchronousCommit != "remote_apply" {
		bad = append(bad, "synchronous_commit = "+r.SynchronousCommit+" (the session could not raise it)")
	}
	if fsync != "on" {
		bad = append(bad, "fsync = "+fsync)
	}
	if fpw != "on" {
		bad = append(bad, "full_page_writes = "+fpw)
	}
	if retry != "off" {
		bad = append(bad, "data_sync_retry = "+retry)
	}
	if len(bad) > 0 {
		return r, fmt.Errorf("%w: %s runs with %s; a crash can lose commits it acknowledged (see docs/postgres.md)",
			ErrNotDurable, target, strings.Join(bad, ", "))
	}
	if !r.Async() {
		return r, nil
	}
	msg := fmt.Sprintf("%s streams to %d standby(s) and none is synchronous (synchronous_standby_names = %q): "+
		"a failover to one of them loses the reservations and commits it had not received, so calls may run twice and "+
		"fencing tokens repeat; set synchronous_standby_names (see docs/postgres.md)", target, r.Standbys, r.StandbyNames)
	if !allowAsync {
		return r, fmt.Errorf("%w: %s, or allow it explicitly (Options.AllowAsyncReplicas, --allow-async-replicas)", ErrAsyncReplicas, msg)
	}
	log.Warn("toolfence: PostgreSQL ledger opened with asynchronous standbys only (allowed by AllowAsyncReplicas): "+msg,
		"target", target, "standbys", r.Standbys)
	return r, nil
}

// readDurability runs durabilitySQL.
func readDurability(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (r Replication, fsync, fpw, retry string, err error) {
	err = q.QueryRow(ctx, durabilitySQL).Scan(&r.SynchronousCommit, &fsync, &fpw, &retry, &r.StandbyNames,
		&r.Standbys, &r.Synchronous, &r.Unseen)
	return r, fsync, fpw, retry, err
}

var _ ledger.ReplicaCounter = (*Ledger)(nil)

// AsyncReplicas implements ledger.ReplicaCounter with one statement (the one Open checks
// with): the number of standbys streaming now when none of them is synchronous, else 0.
// A metrics gauge reads it on each scrape, so a standby attached after Open shows there.
func (l *Ledger) AsyncReplicas(ctx context.Context) (int, error) {
	if err := l.check(); err != nil {
		return 0, err
	}
	r, _, _, _, err := readDurability(ctx, l.pool)
	if err != nil {
		return 0, l.fail("check of the standbys", false, err)
	}
	if r.Async() {
		return r.Standbys, nil
	}
	return 0, nil
}

// Replication returns what Open saw of the server's standbys and the sessions'
// synchronous_commit.
func (l *Ledger) Replication() Replication { return l.replication }
