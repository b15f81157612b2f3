package badger

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Commits that return while a round is running share the next round: one leader syncs
// for all of them, and a round never covers a commit that returned after it started.
func TestGroupSyncCoalesces(t *testing.T) {
	entered := make(chan uint64, 2)
	release := make(chan struct{})
	var g *groupSync
	g = newGroupSync(func() error {
		g.mu.Lock()
		taken := g.taken
		g.mu.Unlock()
		entered <- taken
		<-release
		return nil
	})

	first := g.committed()
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, g.wait(first)) })
	require.Equal(t, uint64(1), <-entered, "round 1 covers the first commit only")

	const followers = 10
	seqs := make([]uint64, followers)
	for i := range seqs {
		seqs[i] = g.committed() // these commits returned while round 1 runs
	}
	for _, s := range seqs {
		wg.Go(func() { assert.NoError(t, g.wait(s)) })
	}
	release <- struct{}{}
	require.Equal(t, uint64(followers+1), <-entered, "round 2 covers every follower")
	release <- struct{}{}
	wg.Wait()

	require.Equal(t, uint64(2), g.rounds, "11 commits, 2 rounds")
	require.Equal(t, uint64(followers+1), g.durable)
	require.NoError(t, g.wait(seqs[3]), "an already durable sequence does not sync again")
	require.Equal(t, uint64(2), g.rounds)
}

// A failed round fails its waiters and everything after it.
func TestGroupSyncPoison(t *testing.T) {
	calls := 0
	g := newGroupSync(func() error {
		calls++
		return errors.New("EIO")
	})
	err := g.wait(g.committed())
	require.ErrorIs(t, err, ErrSyncFailed)
	require.ErrorContains(t, err, "EIO")
	require.ErrorIs(t, g.poisoned(), ErrSyncFailed)
	require.ErrorIs(t, g.wait(g.committed()), ErrSyncFailed)
	require.Equal(t, 1, calls, "no further sync after poisoning")
}

// syncRecorder replaces a logSyncer's fsync and records what each round synced: "name"
// for an fdatasync, "name!" for a full fsync.
type syncRecorder struct {
	synced []string
	fail   func(name string) error
}

func (r *syncRecorder) install(s *logSyncer) {
	s.fsync = func(f *os.File, dataOnly bool) error {
		name := filepath.Base(f.Name())
		if r.fail != nil {
			if err := r.fail(name); err != nil {
				return err
			}
		}
		if !dataOnly {
			name += "!"
		}
		r.synced = append(r.synced, name)
		return syncFile(f, dataOnly)
	}
}

// The log syncer lists the directory every round, fsyncs each sealed file once, fdatasyncs the newest WAL every round and the newest value log
// only in rounds after a big value.
func TestLogSyncerRounds(t *testing.T) {
	dir := t.TempDir()
	touch := func(name string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
	}
	s := newLogSyncer(dir, true)
	t.Cleanup(s.close)
	rec := &syncRecorder{}
	rec.install(s)
	round := func() []string {
		rec.synced = nil
		require.NoError(t, s.sync())
		return rec.synced
	}
	dirName := filepath.Base(dir) + "!"

	touch("00001.mem")
	touch("000001.vlog")
	touch("MANIFEST")
	require.Equal(t, []string{"00001.mem!", "000001.vlog!", dirName, "00001.mem"}, round(),
		"first round: list, fsync the new logs (their size), then the directory, and the WAL")
	require.Equal(t, []string{"00001.mem"}, round(), "nothing new: the WAL only")
	require.Equal(t, 2, s.listings, "every round lists the directory")

	s.markValueLog()
	s.doneValueLog()
	require.Equal(t, []string{"00001.mem", "000001.vlog"}, round(), "a big value was committed")
	require.Equal(t, []string{"00001.mem"}, round(), "the mark is consumed by one round")

	// A big-value commit marked before a round but done after it may write the value log
	// after that round synced it: the next round must sync it again.
	s.markValueLog()
	require.Equal(t, []string{"00001.mem", "000001.vlog"}, round(), "marked, still committing")
	s.doneValueLog()
	require.Equal(t, []string{"00001.mem", "000001.vlog"}, round(), "done after the previous round: synced again")
	require.Equal(t, []string{"00001.mem"}, round(), "covered now")

	touch("00002.mem") // memtable rotation: 00001.mem is sealed
	require.Equal(t, []string{"00001.mem!", "00002.mem!", dirName, "00002.mem"}, round())
	require.Equal(t, []string{"00002.mem"}, round(), "a sealed file is synced once")
	require.Equal(t, 9, s.listings)

	touch("000002.vlog") // the value log rotates only while a big value is written
	s.markValueLog()
	s.doneValueLog()
	require.Equal(t, []string{"000001.vlog!", "000002.vlog!", dirName, "00002.mem", "000002.vlog"}, round())

	touch("00003.mem")
	require.NoError(t, os.Remove(filepath.Join(dir, "00001.mem"))) // flushed to L0
	require.Equal(t, []string{"00002.mem!", "00003.mem!", dirName, "00003.mem"}, round())
	require.NotContains(t, s.sealed, "00001.mem", "vanished files are forgotten")
	require.Equal(t, 11, s.walSyncs, "one per round")
	require.Equal(t, 4, s.vlogSyncs, "one per round while a big value may be uncovered")
}

// Under SyncWrites badger synced the logs' writes: rounds only handle new files.
func TestLogSyncerSyncWritesMode(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"00001.mem", "000001.vlog"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
	}
	s := newLogSyncer(dir, false)
	t.Cleanup(s.close)
	rec := &syncRecorder{}
	rec.install(s)
	s.markValueLog()
	require.NoError(t, s.sync())
	require.Equal(t, []string{"00001.mem!", "000001.vlog!", filepath.Base(dir) + "!"}, rec.synced)
	rec.synced = nil
	require.NoError(t, s.sync())
	require.Empty(t, rec.synced)
}

// A round with no WAL to sync fails rather than acknowledging nothing.
func TestLogSyncerNoWAL(t *testing.T) {
	s := newLogSyncer(t.TempDir(), true)
	t.Cleanup(s.close)
	require.ErrorContains(t, s.sync(), "no .mem file")
}

// A sealed file that vanishes between listing and fsync was flushed to a table: not an
// error. Other sync errors are.
func TestLogSyncerVanishedFile(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"00001.mem", "00002.mem"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
	}
	s := newLogSyncer(dir, true)
	t.Cleanup(s.close)
	rec := &syncRecorder{fail: func(name string) error {
		if name == "00001.mem" {
			return &os.PathError{Op: "fsync", Path: name, Err: os.ErrNotExist}
		}
		return nil
	}}
	rec.install(s)
	require.NoError(t, s.sync())
	require.Equal(t, []string{"00002.mem!", filepath.Base(dir) + "!", "00002.mem"}, rec.synced)

	rec.fail = func(string) error { return errors.New("EIO") }
	require.ErrorContains(t, s.sync(), "EIO", "the WAL sync fails")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "00003.mem"), nil, 0o600))
	require.ErrorContains(t, s.sync(), "EIO", "the sealed file's sync fails")
}

// A double rotation between two rounds (the next WAL created, flushed and deleted while the
// one after it took the writes) must not leave the round syncing a stale WAL.
func TestLogSyncerDoubleRotation(t *testing.T) {
	dir := t.TempDir()
	touch := func(name string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
	}
	s := newLogSyncer(dir, true)
	t.Cleanup(s.close)
	rec := &syncRecorder{}
	rec.install(s)
	touch("00001.mem")
	require.NoError(t, s.sync())

	touch("00002.mem")
	touch("00003.mem")
	require.NoError(t, os.Remove(filepath.Join(dir, "00002.mem")))
	rec.synced = nil
	require.NoError(t, s.sync())
	require.Contains(t, rec.synced, "00003.mem", "the live WAL is synced")
	require.NotEqual(t, "00001.mem", rec.synced[len(rec.synced)-1], "not the stale one")
}

// Open creates a missing store directory and its parents itself (so that it can sync each
// new entry: see createDir); an existing one is left as it is.
func TestCreateDir(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "a", "b", "store")
	require.NoError(t, createDir(dir))
	for _, d := range []string{filepath.Join(base, "a"), filepath.Join(base, "a", "b"), dir} {
		fi, err := os.Stat(d)
		require.NoError(t, err)
		require.True(t, fi.IsDir())
		require.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), d)
	}
	require.NoError(t, createDir(dir), "an existing directory")
	require.NoError(t, createDir(base+string(filepath.Separator)), "a trailing separator")
	require.NoError(t, os.WriteFile(filepath.Join(base, "file"), nil, 0o600))
	require.Error(t, createDir(filepath.Join(base, "file", "store")), "a file in the way")
}
