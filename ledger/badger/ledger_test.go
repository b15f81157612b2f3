package badger

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	dbadger "github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/ledgertest"
	"github.com/toolfence/toolfence/residual"
)

// TestMain checks that no test leaves goroutines behind (badger's, ours), except in the
// crash helper child and the power-loss tests' workers, which are killed; in a worker it
// plants the bug PlantEnv names (plant).
func TestMain(m *testing.M) {
	if os.Getenv(crashRoleEnv) != "" {
		os.Exit(m.Run())
	}
	if os.Getenv(powerWorkerEnv) != "" {
		plant = os.Getenv(PlantEnv)
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}

var modes = []SyncMode{GroupCommit, SyncWrites}

// start is the fake clock's starting instant.
var start = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// openTest opens a ledger in dir for t and closes it at cleanup.
func openTest(t *testing.T, dir string, opts Options) *Ledger {
	t.Helper()
	l, err := Open(dir, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := l.Close(); err != nil && !errors.Is(err, lease.ErrClosed) {
			t.Errorf("close: %v", err)
		}
	})
	return l
}

// harness runs the conformance suite on a fresh store per case, driven by a fake clock.
func harness(mode SyncMode) ledgertest.Harness {
	return ledgertest.Harness{Open: func(t *testing.T) ledgertest.Fixture {
		dir := t.TempDir()
		clock := lease.NewFake(start)
		opts := Options{Clock: clock, Sync: mode}
		l := openTest(t, dir, opts)
		return ledgertest.Fixture{
			Ledger:  l,
			Advance: func(_ *testing.T, d time.Duration) { clock.Advance(d) },
			Now:     func(*testing.T) time.Time { return clock.Now() },
			Reopen: func(t *testing.T) ledger.Ledger {
				require.NoError(t, l.Close())
				return openTest(t, dir, opts)
			},
		}
	}}
}

func TestConformance(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) { ledgertest.Run(t, harness(mode)) })
	}
}

func TestOpenLockedStore(t *testing.T) {
	dir := t.TempDir()
	openTest(t, dir, Options{})
	_, err := Open(dir, Options{})
	require.ErrorIs(t, err, ErrLocked)
	require.EqualError(t, err, "store "+dir+" is in use by another process (badger lock)")
}

// TestOpenWaitsForALockNobodyClaims: badger closes its locked directory descriptor
// without unlocking it, so a child forked at that instant holds the lock until it execs.
// A second descriptor of the directory, locked with no pid file, stands in for that
// child: Open waits for it instead of calling the store in use, and a store that stays
// locked that way is reported locked once lockSettle has passed.
func TestOpenWaitsForALockNobodyClaims(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, openTest(t, dir, Options{}).Close())
	require.NoFileExists(t, filepath.Join(dir, "LOCK"), "badger removes its pid file on close")
	child, err := os.Open(dir)
	require.NoError(t, err)
	defer child.Close()
	require.NoError(t, unix.Flock(int(child.Fd()), unix.LOCK_EX|unix.LOCK_NB))

	retries := 0
	lockRetried = func() {
		retries++
		if retries == 2 {
			require.NoError(t, unix.Flock(int(child.Fd()), unix.LOCK_UN), "the child execs")
		}
	}
	defer func() { lockRetried = nil }()
	l, err := Open(dir, Options{})
	require.NoError(t, err, "a lock nobody claims is waited for")
	require.NoError(t, l.Close())
	require.Equal(t, 2, retries)

	require.NoError(t, unix.Flock(int(child.Fd()), unix.LOCK_EX|unix.LOCK_NB))
	defer func(d time.Duration) { lockSettle = d }(lockSettle)
	lockSettle = 20 * time.Millisecond
	retries = 0
	lockRetried = func() { retries++ }
	_, err = Open(dir, Options{})
	require.ErrorIs(t, err, ErrLocked, "a lock held past lockSettle is reported")
	require.Greater(t, retries, 0)
}

// TestOpenLockedStoreFailsAtOnce: a store whose owner wrote its pid file is refused on
// the first attempt, without waiting.
func TestOpenLockedStoreFailsAtOnce(t *testing.T) {
	dir := t.TempDir()
	openTest(t, dir, Options{})
	lockRetried = func() { t.Error("Open waited for a store its owner claims") }
	defer func() { lockRetried = nil }()
	_, err := Open(dir, Options{})
	require.ErrorIs(t, err, ErrLocked)
}

func TestOpenRejectsBadOptions(t *testing.T) {
	_, err := Open("", Options{})
	require.ErrorIs(t, err, ledger.ErrInvalidParams)
	_, err = Open(t.TempDir(), Options{Sync: SyncMode(7)})
	require.ErrorIs(t, err, ledger.ErrInvalidParams)
}

// Badger writes nothing to stderr or stdout on open and close unless a logger is given.
func TestOpenIsQuiet(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	stderr, stdout := os.Stderr, os.Stdout
	os.Stderr, os.Stdout = w, w
	l, openErr := Open(t.TempDir(), Options{})
	if openErr == nil {
		openErr = l.Close()
	}
	os.Stderr, os.Stdout = stderr, stdout
	require.NoError(t, w.Close())
	require.NoError(t, openErr)
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Empty(t, out, "badger must be silent by default")
}

// A failed sync poisons the ledger: the step whose write it covered and every later
// step fail, and nothing is acknowledged.
func TestSyncFailurePoisons(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			l := openTest(t, t.TempDir(), Options{Clock: lease.NewFake(start), Sync: mode})
			ctx := t.Context()
			ok := reserveParams("ok")
			_, err := l.Reserve(ctx, ok)
			require.NoError(t, err)

			l.gs.sync = func() error { return errors.New("disk on fire") }
			res, err := l.Reserve(ctx, reserveParams("doomed"))
			require.ErrorIs(t, err, ErrSyncFailed)
			require.ErrorIs(t, err, ledger.ErrOutcomeUnknown, "a committed write whose sync failed may or may not survive")
			require.ErrorContains(t, err, "disk on fire")
			require.Nil(t, res, "an unsynced reserve is not acknowledged")

			_, err = l.Reserve(ctx, reserveParams("later"))
			require.NotErrorIs(t, err, ledger.ErrOutcomeUnknown, "a refused step did not happen")

			_, err = l.Reserve(ctx, reserveParams("later"))
			require.ErrorIs(t, err, ErrSyncFailed, "later writes fail closed")
			_, err = l.Get(ctx, ledger.GetParams{Namespace: ok.Namespace, Key: ok.Key})
			require.ErrorIs(t, err, ErrSyncFailed, "reads fail too until reopened")
		})
	}
}

// A step is acknowledged only after a sync round that started after its commit returned:
// the round sees the committed residual, and Reserve has not returned while it runs.
func TestAckWaitsForSync(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			l := openTest(t, t.TempDir(), Options{Clock: lease.NewFake(start), Sync: mode})
			p := reserveParams("acked")
			entered, release := make(chan error, 1), make(chan struct{})
			orig := l.gs.sync
			l.gs.sync = func() error {
				// The commit returned before this round started: its write is visible.
				entered <- l.db.View(func(txn *dbadger.Txn) error {
					_, err := getResidual(&tx{l: l, txn: txn}, p.Namespace, p.Key)
					return err
				})
				<-release
				return orig()
			}
			done := make(chan error, 1)
			go func() {
				_, err := l.Reserve(context.Background(), p)
				done <- err
			}()
			require.NoError(t, <-entered, "the round covers the committed reserve")
			select {
			case err := <-done:
				t.Fatalf("reserve acknowledged before its sync finished (err %v)", err)
			default:
			}
			close(release)
			require.NoError(t, <-done)
		})
	}
}

// A residual stored by one Open is read back by the next, also after badger has rotated
// memtables and value logs (tiny sizes force rotations, flushes and value-log use).
func TestManyWritesAcrossRotations(t *testing.T) {
	dir := t.TempDir()
	clock := lease.NewFake(start)
	opts := Options{Clock: clock, tiny: true}
	l := openTest(t, dir, opts)
	ctx := t.Context()
	const n, workers = 600, 16
	resultSize := func(i int) int {
		if i%10 == 0 {
			return 64 << 10 // above the value threshold: goes to the value log
		}
		return 512
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				p := reserveParams(fmt.Sprint("item-", i))
				p.TTL = time.Hour
				res, err := l.Reserve(ctx, p)
				if !assert.NoError(t, err) {
					return
				}
				_, err = l.Commit(ctx, ledger.CommitParams{
					Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
					Outcome: residual.Succeeded, Result: make([]byte, resultSize(i)),
				})
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	l.gs.mu.Lock() // logSyncer runs inside rounds, under running
	require.False(t, l.gs.running)
	logs, rounds := l.logs, l.gs.rounds
	require.Positive(t, logs.sealedSyncs, "rotated WAL and value-log files were fsynced")
	require.Positive(t, logs.dirSyncs)
	if syncOwnLogs {
		require.Positive(t, logs.vlogSyncs, "rounds after big values synced the value log")
		require.Less(t, logs.vlogSyncs, logs.walSyncs, "the value log is synced only after big values")
	}
	require.Equal(t, uint64(logs.listings), rounds, "the directory is listed every round (double rotations)")
	l.gs.mu.Unlock()
	for _, pattern := range []string{"*.sst", "000002.vlog"} {
		files, err := filepath.Glob(filepath.Join(dir, pattern))
		require.NoError(t, err)
		require.NotEmpty(t, files, "memtables were flushed and value logs rotated: %s", pattern)
	}
	require.NoError(t, l.Close())

	l = openTest(t, dir, opts)
	page, err := l.List(ctx, ledger.ListParams{Namespace: "ns", Limit: ledger.MaxListLimit})
	require.NoError(t, err)
	require.Len(t, page.Residuals, n)
	for _, r := range page.Residuals {
		require.Equal(t, residual.Succeeded, r.State)
		var i int
		_, err := fmt.Sscanf(r.Target, "item-%d", &i)
		require.NoError(t, err)
		require.Len(t, r.Result, resultSize(i))
	}
}

func reserveParams(target string) ledger.ReserveParams {
	return ledger.ReserveParams{
		Namespace: "ns", Key: residual.Key("ns", "task", "op", target), Task: "task",
		Operation: "op", Target: target, Holder: "agent", RequestDigest: "digest", TTL: time.Minute,
	}
}

// Rounds fdatasync the value log only after a value that badger puts there (ValueThreshold
// or longer) was committed, and such a residual survives a reopen. (Off Linux rounds call
// DB.Sync, which syncs the value log every time: no count to check there.)
func TestValueLogSyncedOnlyAfterBigValues(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Clock: lease.NewFake(start)}
	l := openTest(t, dir, opts)
	ctx := t.Context()
	vlogSyncs := func() int {
		l.gs.mu.Lock()
		defer l.gs.mu.Unlock()
		if !syncOwnLogs {
			return -1
		}
		return l.logs.vlogSyncs
	}
	synced := func(n int) int { // n, or -1 where rounds do not count
		if !syncOwnLogs {
			return -1
		}
		return n
	}
	commit := func(target string, size int) {
		p := reserveParams(target)
		res, err := l.Reserve(ctx, p)
		require.NoError(t, err)
		_, err = l.Commit(ctx, ledger.CommitParams{
			Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
			Outcome: residual.Succeeded, Result: make([]byte, size),
		})
		require.NoError(t, err)
	}
	// vlogWritten reports whether badger wrote any entry after the value log's header.
	vlogWritten := func() bool {
		l.gs.mu.Lock()
		name := l.logs.newest[vlogExt].name
		l.gs.mu.Unlock()
		f, err := os.Open(filepath.Join(dir, name))
		require.NoError(t, err)
		defer f.Close()
		buf := make([]byte, 64<<10)
		n, err := io.ReadFull(f, buf)
		require.NoError(t, err)
		return slices.ContainsFunc(buf[20:n], func(b byte) bool { return b != 0 }) // 20: vlogHeaderSize
	}
	commit("small", 256<<10) // the default result cap: stays in the WAL
	require.Equal(t, synced(0), vlogSyncs())
	require.False(t, vlogWritten(), "nothing below the threshold reaches the value log")
	commit("big", valueThreshold) // its JSON is longer than the threshold
	require.Equal(t, synced(1), vlogSyncs(), "the commit's round synced the value log")
	require.True(t, vlogWritten())
	commit("small-again", 1<<10)
	require.Equal(t, synced(1), vlogSyncs())

	require.NoError(t, l.Close())
	l = openTest(t, dir, opts)
	r, err := l.Get(ctx, ledger.GetParams{Namespace: "ns", Key: reserveParams("big").Key})
	require.NoError(t, err)
	require.Len(t, r.Result, valueThreshold)
}
