//go:build unix

package badger

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
)

// worldWritable returns a new directory with mode 1777, like /tmp.
func worldWritable(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmp")
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, os.Chmod(dir, 0o1777))
	return dir
}

// TestOpenRefusesSquattedDir: a directory another user created first in a world-writable
// parent (mode 0777, owner nobody) is refused, with its owner, mode and the way out, and
// nothing is written in it; so is a directory of ours that group or others can write.
func TestOpenRefusesSquattedDir(t *testing.T) {
	t.Parallel()
	uid, gid := testkit.Nobody(t, "create a directory as another user")
	squatted := filepath.Join(worldWritable(t), "store")
	require.NoError(t, os.Mkdir(squatted, 0o777))
	require.NoError(t, os.Chmod(squatted, 0o777))
	require.NoError(t, os.Chown(squatted, uid, gid)) // as if nobody had made it
	_, err := Open(squatted, Options{})
	require.ErrorIs(t, err, ErrUnsafeDir)
	require.ErrorContains(t, err, squatted)
	require.ErrorContains(t, err, "owned by uid "+strconv.Itoa(uid)+" (nobody) with mode 0777")
	require.ErrorContains(t, err, "not by you (uid "+strconv.Itoa(os.Geteuid()))
	require.ErrorContains(t, err, "chmod 0700")
	entries, err := os.ReadDir(squatted)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing was written in the squatted directory")

	for _, mode := range []os.FileMode{0o777, 0o770, 0o702} {
		ours := filepath.Join(t.TempDir(), "store")
		require.NoError(t, os.Mkdir(ours, 0o700))
		require.NoError(t, os.Chmod(ours, mode))
		_, err = Open(ours, Options{})
		require.ErrorIs(t, err, ErrUnsafeDir, "mode %04o", mode)
		require.ErrorContains(t, err, "group or other users can write it")
		require.ErrorContains(t, err, "chmod 0700 "+ours)
	}
}

// TestOpenRefusesSymlinkOfOthers: a symlink planted by another user is refused even when
// it points at a directory of ours (it could be swapped later).
func TestOpenRefusesSymlinkOfOthers(t *testing.T) {
	t.Parallel()
	uid, gid := testkit.Nobody(t, "create a directory as another user")
	target := t.TempDir()
	link := filepath.Join(worldWritable(t), "store")
	require.NoError(t, os.Symlink(target, link))
	require.NoError(t, os.Lchown(link, uid, gid))
	_, err := Open(link, Options{})
	require.ErrorIs(t, err, ErrUnsafeDir)
	require.ErrorContains(t, err, "symlink owned by uid "+strconv.Itoa(uid))
}

// TestOpenCreatesPrivateDir: a new store directory, and its missing parents, are created
// with mode 0700 and owned by us, inside a world-writable parent too; a directory of ours
// with mode 0755 (nobody else can write it) is taken.
func TestOpenCreatesPrivateDir(t *testing.T) {
	t.Parallel()
	parent := worldWritable(t)
	dir := filepath.Join(parent, "a", "b", "store")
	l := openTest(t, dir, Options{})
	require.NotNil(t, l)
	for _, d := range []string{filepath.Join(parent, "a"), filepath.Join(parent, "a", "b"), dir} {
		fi, err := os.Stat(d)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), d)
		require.Equal(t, uint32(os.Geteuid()), fi.Sys().(*syscall.Stat_t).Uid, d)
	}

	shared := filepath.Join(t.TempDir(), "store")
	require.NoError(t, os.Mkdir(shared, 0o700))
	require.NoError(t, os.Chmod(shared, 0o755))
	openTest(t, shared, Options{})
}
