package badger

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	dbadger "github.com/dgraph-io/badger/v4"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/rules"
	"github.com/toolfence/toolfence/residual"
)

// SyncMode selects how a step's write reaches stable storage before the step returns.
// Both modes acknowledge nothing before it is synced; they differ in throughput.
type SyncMode int

const (
	// GroupCommit (the default) commits without syncing and then waits for a store-wide
	// sync that started after the commit returned; concurrent steps share one sync.
	GroupCommit SyncMode = iota
	// SyncWrites opens badger with SyncWrites, so every commit syncs before it returns.
	SyncWrites
)

// String returns "group-commit" or "sync-writes".
func (m SyncMode) String() string {
	switch m {
	case GroupCommit:
		return "group-commit"
	case SyncWrites:
		return "sync-writes"
	}
	return fmt.Sprintf("sync-mode(%d)", int(m))
}

// Options configure Open. The zero value is ready to use.
type Options struct {
	// Clock decides lease expiry and stamps records. Defaults to lease.Real{}.
	Clock lease.Clock
	// Sync selects the durability mechanism. Defaults to GroupCommit.
	Sync SyncMode
	// Logger receives badger's own log output. Defaults to nil: badger logs nothing.
	Logger dbadger.Logger
	// ReplayCacheBytes bounds the in-memory cache of succeeded residuals that serves
	// replays without a transaction (approximate bytes, counted as stored JSON). Defaults
	// to 8 MiB; a negative value turns the cache off.
	ReplayCacheBytes int64
	// MeterProvider records the group-commit batch sizes (toolfence.badger.sync.batch_size:
	// commits made durable by one sync round). Defaults to otel.GetMeterProvider(), which
	// records nothing unless the program installs an OpenTelemetry SDK.
	MeterProvider metric.MeterProvider
	// MinFree is the free space, in bytes, kept on the store's filesystem: below it new
	// reservations are refused with an error wrapping ErrLowSpace; below half of it,
	// resolutions and evidence too; commits, renewals and gc go on down to a floor sized
	// from badger's memtables (about 56 MiB), where every write stops (see space.go). Open
	// fails, with ErrLowSpace, below that floor. Defaults to DefaultMinFree; it must be at
	// least twice the floor.
	MinFree uint64
	// FreeSpace reads the free space of the store's filesystem. Defaults to DiskFree.
	FreeSpace FreeSpace

	// tiny shrinks memtables, value threshold and value-log files to badger's minimums, so
	// tests exercise memtable and value-log rotation with little data.
	tiny bool
}

// Memory budget: a ledger holds small JSON records, so badger's defaults (64 MiB memtables,
// 256 MiB block cache) are far more than it needs.
const (
	defaultMemTableSize   = 16 << 20
	defaultBlockCacheSize = 16 << 20
	// valueThreshold is badger's maximum (and default) ValueThreshold: values this long or
	// longer go to the value log, shorter ones stay in the WAL and the LSM tree. Set
	// explicitly because the sync rounds depend on it (see sync.go).
	valueThreshold = 1 << 20
	// defaultReplayCacheBytes is the default of Options.ReplayCacheBytes.
	defaultReplayCacheBytes = 8 << 20
	// maxConflictRetries bounds the optimistic retries of one step.
	maxConflictRetries = 200
)

// ErrLocked is wrapped by Open when another process (or another Open in this process)
// holds the store's directory lock.
var ErrLocked = errors.New("badger: store is locked")

// ErrSyncFailed is wrapped by every step after a sync of the store failed: writes that
// returned from commit may not be durable, so the ledger fails closed until reopened.
var ErrSyncFailed = errors.New("badger: sync failed, ledger refuses further steps")

type lockedError struct{ dir string }

func (e *lockedError) Error() string {
	return "store " + e.dir + " is in use by another process (badger lock)"
}

func (e *lockedError) Is(target error) bool { return target == ErrLocked }

// Ledger is the badger-backed ledger.Ledger. It is safe for concurrent use.
type Ledger struct {
	db    *dbadger.DB
	dir   string
	clock lease.Clock
	mode  SyncMode
	gs    *groupSync
	logs  *logSyncer
	// dbSync: rounds call DB.Sync for the active logs (GroupCommit off Linux).
	dbSync bool
	hub    *hub
	cache  *replayCache
	// valueThreshold is the ValueThreshold badger was opened with.
	valueThreshold int64
	// durable is a badger read timestamp such that every commit at or below it is
	// durable: set by each successful sync round (see sync.go).
	durable atomic.Uint64

	mu     sync.RWMutex // held shared by every step, exclusively by Close
	closed bool

	open openIndex // open residuals, for OpenResiduals

	space spaceGuard // checked before every write
}

var (
	_ ledger.Ledger  = (*Ledger)(nil)
	_ ledger.Watcher = (*Ledger)(nil)
)

// Open opens (creating if needed) the store in dir. A missing dir is created with mode
// 0700; an existing one owned by another user, or writable by group or others, is refused
// with an error wrapping ErrUnsafeDir. It returns an error wrapping ErrLowSpace when the
// filesystem is too full to open the store safely, one wrapping ErrLocked when another
// process has the store open, and other errors when badger cannot open it.
func Open(dir string, opts Options) (*Ledger, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: badger ledger needs a directory", ledger.ErrInvalidParams)
	}
	switch opts.Sync {
	case GroupCommit, SyncWrites:
	default:
		return nil, fmt.Errorf("%w: unknown sync mode %d", ledger.ErrInvalidParams, int(opts.Sync))
	}
	bo := dbadger.DefaultOptions(dir).
		WithSyncWrites(opts.Sync == SyncWrites).
		WithLogger(opts.Logger).
		WithMemTableSize(defaultMemTableSize).
		WithBlockCacheSize(defaultBlockCacheSize).
		WithValueThreshold(valueThreshold).
		WithNumVersionsToKeep(1).
		WithDetectConflicts(true)
	if opts.tiny {
		bo = bo.WithMemTableSize(1 << 20).WithValueThreshold(4 << 10).WithValueLogFileSize(1 << 20)
	}
	space := spaceGuard{dir: dir, free: opts.FreeSpace, minFree: cmp.Or(opts.MinFree, DefaultMinFree), floor: spaceFloor(bo)}
	if space.free == nil {
		space.free = DiskFree
	}
	if space.minFree < 2*space.floor {
		return nil, fmt.Errorf("%w: MinFree %d MiB is below twice the floor of %d MiB that badger's memtables need", ledger.ErrInvalidParams, space.minFree>>20, space.floor>>20)
	}
	// createDir makes a new directory's entry durable (its parents fsynced); prepareDir then
	// refuses one another user owns or can write, before anything in it is touched.
	if err := createDir(dir); err != nil {
		return nil, fmt.Errorf("badger: create %s: %w", dir, err)
	}
	if err := prepareDir(dir); err != nil {
		return nil, err
	}
	if err := space.checkOpen(); err != nil {
		return nil, err
	}
	if err := removeEmptyLogs(dir); err != nil {
		return nil, fmt.Errorf("badger: remove empty log files in %s: %w", dir, err)
	}
	db, err := openSettled(bo)
	if err != nil {
		if isLockErr(err) {
			return nil, &lockedError{dir: dir}
		}
		return nil, fmt.Errorf("badger: open %s: %w", dir, err)
	}
	cacheBytes := cmp.Or(opts.ReplayCacheBytes, defaultReplayCacheBytes)
	l := &Ledger{
		db:    db,
		dir:   dir,
		clock: cmp.Or[lease.Clock](opts.Clock, lease.Real{}),
		mode:  opts.Sync,
		hub:   newHub(),
		// Under SyncWrites every commit already msynced its WAL and value log; what remains
		// is sealed files and the directory entries of new files (see sync.go).
		logs:           newLogSyncer(dir, opts.Sync == GroupCommit && syncOwnLogs),
		dbSync:         opts.Sync == GroupCommit && !syncOwnLogs,
		cache:          newReplayCache(cacheBytes),
		valueThreshold: bo.ValueThreshold,
		space:          space,
	}
	l.gs = newGroupSync(l.syncRound)
	mp := opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if h, err := mp.Meter("github.com/toolfence/toolfence").Int64Histogram("toolfence.badger.sync.batch_size",
		metric.WithUnit("{commit}"), metric.WithDescription("Commits made durable by one group-commit sync round of the badger ledger."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256)); err == nil {
		l.gs.batch = func(n uint64) { h.Record(context.Background(), int64(n)) }
	}
	if err := l.buildIndex(); err != nil {
		l.logs.close()
		_ = db.Close()
		return nil, err
	}
	// Make everything badger wrote while opening durable before the first step relies on it.
	if err := l.gs.wait(l.gs.committed()); err != nil {
		l.logs.close()
		_ = db.Close()
		return nil, err
	}
	return l, nil
}

// syncRound is one group-commit round: steps 1 to 5 of the comment at the top of sync.go.
func (l *Ledger) syncRound() error {
	txn := l.db.NewTransaction(false)
	applied := txn.ReadTs() // every commit up to it has been written to the logs
	txn.Discard()
	if l.dbSync {
		if err := l.db.Sync(); err != nil {
			return err
		}
	}
	if err := l.logs.sync(); err != nil {
		return err
	}
	// Rounds run one at a time and read timestamps only grow; max keeps it monotone anyway.
	for {
		cur := l.durable.Load()
		if applied <= cur || l.durable.CompareAndSwap(cur, applied) {
			return nil
		}
	}
}

// awaitDurable returns once every commit up to version is durable: at once when a round
// already covered it, else after a round that starts now (the commit is visible, so it is
// in the logs that round syncs). It fails when that round fails.
func (l *Ledger) awaitDurable(version uint64) error {
	if version <= l.durable.Load() {
		return nil
	}
	return l.gs.wait(l.gs.committed())
}

// lockSettle bounds how long Open waits for a directory lock that no process claims (see
// openSettled); lockRetried, when set by a test, runs before each wait.
var (
	lockSettle  = time.Second
	lockRetried func()
)

// openSettled opens badger, waiting up to lockSettle while the directory lock is held but
// badger's pid file is absent. badger removes that file and then closes the locked
// descriptor without unlocking it, so a child forked by any goroutine of this process
// shares the lock until it execs: a Close then an Open of the same store in one process
// can fail for that instant. A live owner writes its pid file right after locking, so a
// store really in use still fails at once (after at most lockSettle if its owner is
// between the two).
func openSettled(bo dbadger.Options) (*dbadger.DB, error) {
	deadline := time.Now().Add(lockSettle)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		db, err := dbadger.Open(bo)
		if err == nil || !isLockErr(err) || time.Now().After(deadline) {
			return db, err
		}
		if _, serr := os.Stat(filepath.Join(bo.Dir, "LOCK")); !errors.Is(serr, fs.ErrNotExist) {
			return nil, err
		}
		if lockRetried != nil {
			lockRetried()
		}
		time.Sleep(wait)
	}
}

// isLockErr reports whether err is badger's directory-lock failure. badger formats the
// flock error with %+v (not %w) unless built in debug mode, so the text is matched too.
func isLockErr(err error) bool {
	return errors.Is(err, syscall.EWOULDBLOCK) ||
		strings.Contains(err.Error(), "Cannot acquire directory lock")
}

// Dir returns the directory the ledger was opened on.
func (l *Ledger) Dir() string { return l.dir }

// Close waits for in-flight steps, ends every Watch channel and closes the store. A second
// Close returns lease.ErrClosed.
func (l *Ledger) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return lease.ErrClosed
	}
	l.closed = true
	l.hub.close()
	l.logs.close()
	if err := l.db.Close(); err != nil {
		return fmt.Errorf("badger: close %s: %w", l.dir, err)
	}
	return nil
}

// enter admits one step: it fails with lease.ErrClosed after Close and with ErrSyncFailed
// once a sync failed. On success the caller must call the returned release.
func (l *Ledger) enter() (release func(), err error) {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return nil, lease.ErrClosed
	}
	if err := l.gs.poisoned(); err != nil {
		l.mu.RUnlock()
		return nil, err
	}
	return l.mu.RUnlock, nil
}

// now reads the ledger's clock in UTC, the form stored.
func (l *Ledger) now() time.Time { return l.clock.Now().UTC() }

// tx is one try of a step's transaction. Writes go through set and del, which note the
// residual keys to evict from the replay cache and whether a value goes to the value log;
// reads through readResidual note the newest version read, so an answer given from them
// waits until it is durable.
type tx struct {
	l       *Ledger
	txn     *dbadger.Txn
	touched []string // residual store keys written or deleted
	read    uint64   // highest badger version read
	big     bool     // a value goes to the value log
	bytes   int      // bytes of keys and values staged, for the space guard
	// puts holds the residuals written (nil: deleted) by store key, for the open index.
	puts map[string]*openEntry
	// stored holds what was read of each residual (by store key), for the filter index.
	stored map[string]storedInfo
}

// set stages key = value, noting a value that badger will put in the value log, so update
// marks the commit for the sync rounds (see sync.go).
func (t *tx) set(key, value []byte) error {
	if int64(len(value)) >= t.l.valueThreshold {
		t.big = true
	}
	t.touch(key)
	t.bytes += len(key) + len(value)
	return t.txn.Set(key, value)
}

// del stages the deletion of key.
func (t *tx) del(key []byte) error {
	t.touch(key)
	t.bytes += len(key)
	t.noteWrite(key, nil)
	return t.txn.Delete(key)
}

func (t *tx) touch(key []byte) {
	if len(key) >= len(residualPrefix) && string(key[:len(residualPrefix)]) == residualPrefix {
		t.touched = append(t.touched, string(key))
	}
}

// noteWrite records a residual written (nil: deleted) under a residual store key.
func (t *tx) noteWrite(key []byte, e *openEntry) {
	if len(key) < len(residualPrefix) || string(key[:len(residualPrefix)]) != residualPrefix {
		return
	}
	if t.puts == nil {
		t.puts = map[string]*openEntry{}
	}
	t.puts[string(key)] = e
}

// noteRead records that the step's answer depends on an item of this version.
func (t *tx) noteRead(version uint64) { t.read = max(t.read, version) }

// update runs fn in a read-write transaction, retrying on badger.ErrConflict. fn returns
// whether its writes must be committed and the step's own error (which may accompany a
// write, as a refused commit's evidence does). A committed write is acknowledged only
// after it is durable, and so is an answer fn gave from what it read without writing; ctx
// is checked before each try but does not cut those waits short, since a step that
// committed must not report that it did not happen.
func (l *Ledger) update(ctx context.Context, op string, fn func(t *tx, now time.Time) (write bool, err error)) error {
	release, err := l.enter()
	if err != nil {
		return err
	}
	defer release()
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		t := &tx{l: l, txn: l.db.NewTransaction(true)}
		write, stepErr := fn(t, l.now())
		if !write {
			t.txn.Discard()
			if err := l.awaitDurable(t.read); err != nil {
				return fmt.Errorf("badger: %s: %w", op, err)
			}
			return stepErr
		}
		if err := l.space.check(op, t.bytes); err != nil {
			t.txn.Discard()
			return err // nothing of this step was written
		}
		if t.big {
			l.logs.markValueLog()
		}
		// No replay is answered from the cache between the commit and the eviction.
		l.cache.hold(t.touched)
		err := t.txn.Commit()
		// The new versions are visible now (or nothing was written): evict what they
		// replace, before anyone can be told the write happened.
		l.cache.release(t.touched)
		if t.big {
			l.logs.doneValueLog()
		}
		if errors.Is(err, dbadger.ErrConflict) {
			if attempt < maxConflictRetries {
				continue
			}
			return fmt.Errorf("badger: %s: gave up after %d conflicting transactions: %w", op, attempt+1, err)
		}
		if err != nil {
			return fmt.Errorf("badger: %s: commit: %w", op, err)
		}
		l.open.note(t.puts)
		if err := l.gs.wait(l.gs.committed()); err != nil {
			// The write is committed but may not be durable: after a restart it may or
			// may not be there.
			return fmt.Errorf("%w: badger: %s: the write was committed but syncing it failed: %w", ledger.ErrOutcomeUnknown, op, err)
		}
		return stepErr
	}
}

// view runs fn in a read-only transaction and, when fn succeeds, waits until every version
// it noted is durable.
func (l *Ledger) view(ctx context.Context, fn func(t *tx, now time.Time) error) error {
	release, err := l.enter()
	if err != nil {
		return err
	}
	defer release()
	if err := ctx.Err(); err != nil {
		return err
	}
	t := &tx{l: l, txn: l.db.NewTransaction(false)}
	err = fn(t, l.now())
	t.txn.Discard()
	if err != nil {
		return err
	}
	return l.awaitDurable(t.read)
}

// Storage layout: residual JSON under "r/<namespace>\x00<key>"; the highest fencing token
// ever issued for the key, big-endian uint64, under "t/<namespace>\x00<key>"; the filter
// index under "x/" (see index.go). GC deletes r/ entries and their x/ entries only, so
// tokens keep growing across collection.
const (
	residualPrefix = "r/"
	tokenPrefix    = "t/"
)

func storeKey(prefix, namespace, key string) []byte {
	b := make([]byte, 0, len(prefix)+len(namespace)+1+len(key))
	b = append(b, prefix...)
	b = append(b, namespace...)
	b = append(b, 0)
	return append(b, key...)
}

func nsPrefix(namespace string) []byte { return storeKey(residualPrefix, namespace, "") }

// decodeItem decodes the residual stored in item and notes its version in t. name names
// the residual in errors.
func decodeItem(t *tx, item *dbadger.Item, name string, r *residual.Residual) error {
	if err := item.Value(func(v []byte) error { return json.Unmarshal(v, r) }); err != nil {
		return fmt.Errorf("badger: decode residual %s: %w", name, err)
	}
	r.AttemptCount = rules.AttemptCount(r) // records written before the count was stored
	t.noteRead(item.Version())
	return nil
}

// readResidual loads the residual of (ns, key) and its stored length, or returns an error
// wrapping residual.ErrNotFound.
func readResidual(t *tx, ns, key string) (*residual.Residual, int, error) {
	k := storeKey(residualPrefix, ns, key)
	item, err := t.txn.Get(k)
	if errors.Is(err, dbadger.ErrKeyNotFound) {
		t.noteStored(k, storedInfo{})
		return nil, 0, fmt.Errorf("%w: key %s in namespace %q", residual.ErrNotFound, key, ns)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("badger: read %s: %w", key, err)
	}
	var r residual.Residual
	if err := decodeItem(t, item, key, &r); err != nil {
		return nil, 0, err
	}
	t.noteStored(k, storedInfo{exists: true, open: r.State.Open()})
	return &r, int(item.ValueSize()), nil
}

// getResidual loads the residual of (ns, key), or returns an error wrapping
// residual.ErrNotFound.
func getResidual(t *tx, ns, key string) (*residual.Residual, error) {
	r, _, err := readResidual(t, ns, key)
	return r, err
}

// findResidual is getResidual with a missing residual as nil, nil.
func findResidual(t *tx, ns, key string) (*residual.Residual, error) {
	r, err := getResidual(t, ns, key)
	if errors.Is(err, residual.ErrNotFound) {
		return nil, nil
	}
	return r, err
}

func putResidual(t *tx, r *residual.Residual) error {
	v, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("badger: encode residual %s: %w", r.Key, err)
	}
	k := storeKey(residualPrefix, r.Namespace, r.Key)
	if err := indexResidual(t, k, r); err != nil {
		return err
	}
	if err := t.set(k, v); err != nil {
		return fmt.Errorf("badger: write residual %s: %w", r.Key, err)
	}
	e := entryOf(r)
	t.noteWrite(k, &e)
	return nil
}

// nextToken returns one more than the highest token issued for (ns, key), counting the
// stored counter and r's token, and stages the new counter in t.
func nextToken(t *tx, ns, key string, r *residual.Residual) (uint64, error) {
	k := storeKey(tokenPrefix, ns, key)
	var last uint64
	item, err := t.txn.Get(k)
	switch {
	case errors.Is(err, dbadger.ErrKeyNotFound):
	case err != nil:
		return 0, fmt.Errorf("badger: read token of %s: %w", key, err)
	default:
		if err := item.Value(func(v []byte) error {
			if len(v) != 8 {
				return fmt.Errorf("token counter of %s has %d bytes", key, len(v))
			}
			last = binary.BigEndian.Uint64(v)
			return nil
		}); err != nil {
			return 0, fmt.Errorf("badger: %w", err)
		}
	}
	if r != nil {
		last = max(last, r.Token)
	}
	next := last + 1
	if err := t.set(k, binary.BigEndian.AppendUint64(nil, next)); err != nil {
		return 0, fmt.Errorf("badger: write token of %s: %w", key, err)
	}
	return next, nil
}
