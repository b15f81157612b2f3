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

// fileSyncer fsyncs sealed log files once, never the newest of each kind, and the
// directory only when a file appeared.
func TestFileSyncerSealedFilesAndDir(t *testing.T) {
	dir := t.TempDir()
	touch := func(name string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
	}
	var synced []string
	f := newFileSyncer(dir)
	f.fsync = func(path string) error {
		synced = append(synced, filepath.Base(path))
		return fsyncPath(path)
	}
	round := func() []string {
		synced = nil
		require.NoError(t, f.sync())
		return synced
	}

	touch("00001.mem")
	touch("000001.vlog")
	touch("MANIFEST")
	require.Equal(t, []string{filepath.Base(dir)}, round(), "new files: directory only; newest logs are DB.Sync's")
	require.Empty(t, round(), "nothing new, nothing sealed")

	touch("00002.mem") // memtable rotation: 00001.mem is sealed
	require.ElementsMatch(t, []string{"00001.mem", filepath.Base(dir)}, round())
	require.Empty(t, round(), "a sealed file is synced once")

	touch("00003.mem")
	touch("000002.vlog")
	require.NoError(t, os.Remove(filepath.Join(dir, "00001.mem"))) // flushed to L0
	require.ElementsMatch(t, []string{"00002.mem", "000001.vlog", filepath.Base(dir)}, round())
	require.NotContains(t, f.sealed, "00001.mem", "vanished files are forgotten")
}

// A sealed file that vanishes between listing and fsync was flushed to a table: not an error.
func TestFileSyncerVanishedFile(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"00001.mem", "00002.mem"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
	}
	f := newFileSyncer(dir)
	f.fsync = func(path string) error {
		if filepath.Base(path) == "00001.mem" {
			return &os.PathError{Op: "open", Path: path, Err: os.ErrNotExist}
		}
		return nil
	}
	require.NoError(t, f.sync())
	f.fsync = func(string) error { return errors.New("EIO") }
	require.NoError(t, f.sync(), "nothing new or unsynced")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "00003.mem"), nil, 0o600))
	require.ErrorContains(t, f.sync(), "EIO")
}
