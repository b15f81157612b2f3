package lazyfs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
)

// requireAvailable skips t when a lazy FS cannot be mounted here, and fails it under
// CI=true (CI installs what it needs: see .ci/run).
func requireAvailable(t *testing.T) {
	t.Helper()
	testkit.SkipShort(t, "mounts a FUSE filesystem")
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true: the lazy FS must be mountable)", err)
		}
		t.Skip(err)
	}
}

type bundle struct {
	fs  *FS
	mnt string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	requireAvailable(t)
	base := t.TempDir()
	f, err := New(filepath.Join(base, "backing"))
	require.NoError(t, err)
	mnt := filepath.Join(base, "mnt")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	require.NoError(t, f.Mount(mnt))
	t.Cleanup(func() { require.NoError(t, f.Close()) })
	return &bundle{fs: f, mnt: mnt}
}

func (b *bundle) path(name string) string { return filepath.Join(b.mnt, name) }

// write writes data to name (creating it), fsyncing the file when sync is set.
func (b *bundle) write(t *testing.T, name string, data []byte, sync bool) {
	t.Helper()
	f, err := os.OpenFile(b.path(name), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	require.NoError(t, err)
	_, err = f.Write(data)
	require.NoError(t, err)
	if sync {
		require.NoError(t, f.Sync())
	}
	require.NoError(t, f.Close())
}

// syncDir fsyncs the directory name ("" is the root).
func (b *bundle) syncDir(t *testing.T, name string) {
	t.Helper()
	d, err := os.Open(b.path(name))
	require.NoError(t, err)
	require.NoError(t, d.Sync())
	require.NoError(t, d.Close())
}

func (b *bundle) cut(t *testing.T) CutStats {
	t.Helper()
	st, err := b.fs.Cut()
	require.NoError(t, err)
	return st
}

func (b *bundle) requireContent(t *testing.T, name string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(b.path(name))
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "%s: want %d bytes, got %d", name, len(want), len(got))
}

func (b *bundle) requireGone(t *testing.T, name string) {
	t.Helper()
	_, err := os.Stat(b.path(name))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestUnsyncedWriteIsLost(t *testing.T) {
	b := setup(t)
	b.write(t, "f", []byte("durable"), true)
	b.syncDir(t, "")
	b.write(t, "f", []byte("lost, and longer"), false)
	b.requireContent(t, "f", []byte("lost, and longer"))
	st := b.cut(t)
	require.Equal(t, CutStats{Pages: 1, Files: 1}, st)
	b.requireContent(t, "f", []byte("durable"))
}

func TestSyncedWriteSurvives(t *testing.T) {
	b := setup(t)
	data := bytes.Repeat([]byte("0123456789"), 2000) // several pages, the last one partial
	b.write(t, "f", data, true)
	b.syncDir(t, "")
	require.Equal(t, CutStats{}, b.cut(t))
	b.requireContent(t, "f", data)
	c := b.fs.Counters()
	require.Equal(t, 1, c.FileSyncs)
	require.Equal(t, 1, c.DirSyncs)
	require.Equal(t, 5, c.SyncedPages)
}

func TestCreateWithoutDirSyncIsLost(t *testing.T) {
	b := setup(t)
	b.write(t, "f", []byte("synced data, unsynced name"), true)
	st := b.cut(t)
	require.Equal(t, 1, st.Entries)
	require.Equal(t, 1, st.Vanished)
	b.requireGone(t, "f")
	ents, err := os.ReadDir(b.fs.backing)
	require.NoError(t, err)
	require.Empty(t, ents, "the vanished file's blob is deleted")
}

func TestMkdirWithoutParentSyncIsLost(t *testing.T) {
	b := setup(t)
	require.NoError(t, os.Mkdir(b.path("d"), 0o755))
	b.write(t, "d/f", []byte("x"), true)
	b.syncDir(t, "d") // the file's entry is durable in d, but d itself is not in the root
	b.cut(t)
	b.requireGone(t, "d")

	require.NoError(t, os.Mkdir(b.path("d"), 0o755))
	b.write(t, "d/f", []byte("x"), true)
	b.syncDir(t, "d")
	b.syncDir(t, "")
	b.cut(t)
	b.requireContent(t, "d/f", []byte("x"))
}

func TestRename(t *testing.T) {
	b := setup(t)
	b.write(t, "old", []byte("old"), true)
	b.write(t, "tmp", []byte("new"), true)
	b.syncDir(t, "")

	// Not synced: the rename reverts, and the replaced file comes back.
	require.NoError(t, os.Rename(b.path("tmp"), b.path("old")))
	b.requireContent(t, "old", []byte("new"))
	b.requireGone(t, "tmp")
	st := b.cut(t)
	require.Equal(t, 2, st.Entries) // "old" points elsewhere, "tmp" removed
	b.requireContent(t, "old", []byte("old"))
	b.requireContent(t, "tmp", []byte("new"))

	// Synced: it holds.
	require.NoError(t, os.Rename(b.path("tmp"), b.path("old")))
	b.syncDir(t, "")
	b.cut(t)
	b.requireContent(t, "old", []byte("new"))
	b.requireGone(t, "tmp")

	// Between directories, synced in the target only: the file is in both after the cut.
	require.NoError(t, os.Mkdir(b.path("d"), 0o755))
	b.syncDir(t, "")
	require.NoError(t, os.Rename(b.path("old"), b.path("d/moved")))
	b.syncDir(t, "d")
	b.cut(t)
	b.requireContent(t, "old", []byte("new"))
	b.requireContent(t, "d/moved", []byte("new"))

	require.ErrorIs(t, os.Rename(b.path("d"), b.path("e")), errors.ErrUnsupported, "renaming a directory is not supported")
}

func TestUnlinkWithoutDirSyncComesBack(t *testing.T) {
	b := setup(t)
	b.write(t, "f", []byte("here"), true)
	b.syncDir(t, "")
	require.NoError(t, os.Remove(b.path("f")))
	b.requireGone(t, "f")
	b.cut(t)
	b.requireContent(t, "f", []byte("here"))

	require.NoError(t, os.Remove(b.path("f")))
	b.syncDir(t, "")
	st := b.cut(t)
	require.Equal(t, 1, st.Vanished)
	b.requireGone(t, "f")
}

func TestTruncateAndHoles(t *testing.T) {
	b := setup(t)
	data := bytes.Repeat([]byte{'a'}, 3*pageSize)
	b.write(t, "f", data, true)
	b.syncDir(t, "")

	f, err := os.OpenFile(b.path("f"), os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(100))
	_, err = f.WriteAt([]byte("z"), 2*pageSize+1)
	require.NoError(t, err)
	want := make([]byte, 2*pageSize+2)
	copy(want, data[:100])
	want[2*pageSize+1] = 'z'
	b.requireContent(t, "f", want) // the truncated bytes read as zeros, not as the old data

	require.NoError(t, f.Sync())
	require.NoError(t, f.Truncate(1))
	require.NoError(t, f.Close())
	b.cut(t)
	b.requireContent(t, "f", want)
}

func TestExport(t *testing.T) {
	b := setup(t)
	require.NoError(t, os.Mkdir(b.path("d"), 0o755))
	b.write(t, "d/f", []byte("kept"), true)
	b.write(t, "d/g", []byte("name never synced"), true)
	b.syncDir(t, "")
	b.write(t, "d/f", []byte("unsynced"), false)
	require.NoError(t, os.Rename(b.path("d/g"), b.path("d/h"))) // d's entries f and h are synced below
	b.syncDir(t, "d")
	require.NoError(t, os.Remove(b.path("d/h")))

	out := filepath.Join(filepath.Dir(b.fs.backing), "export")
	require.NoError(t, b.fs.Export(out))
	got, err := os.ReadFile(filepath.Join(out, "d", "f"))
	require.NoError(t, err)
	require.Equal(t, "kept", string(got))
	got, err = os.ReadFile(filepath.Join(out, "d", "h"))
	require.NoError(t, err)
	require.Equal(t, "name never synced", string(got))
	require.Error(t, b.fs.Mount(b.mnt), "an exported FS is not mounted again")
}
