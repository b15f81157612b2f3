//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
)

// TestSquattedStoreDirRefused: user nobody creates the store directory first, mode 0777,
// in a world-writable parent (as anyone can in /tmp); toolfence run on it (as root here)
// refuses it with the path, owner, mode and what to do, and writes nothing there, so the
// squatter has no ledger to delete. A store directory of ours that others can write is
// refused the same way, also for a command that only reads (ls). Off root the test skips,
// under CI=true it fails: CI runs it as root.
func TestSquattedStoreDirRefused(t *testing.T) {
	t.Parallel()
	uid, gid := testkit.Nobody(t, "to create a directory as user nobody")
	tmp := filepath.Join(t.TempDir(), "tmp")
	require.NoError(t, os.Mkdir(tmp, 0o700))
	require.NoError(t, os.Chmod(tmp, 0o1777))

	squatted := filepath.Join(tmp, "toolfence")
	require.NoError(t, os.Mkdir(squatted, 0o700))
	require.NoError(t, os.Chmod(squatted, 0o777))
	require.NoError(t, os.Chown(squatted, uid, gid))
	r := tf(t, nil, "serve", "--stdio", "--store", squatted)
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, "store directory "+squatted+" is owned by uid "+strconv.Itoa(uid)+" (nobody) with mode 0777, not by you (uid 0")
	require.Contains(t, r.stderr, "chmod 0700")
	entries, err := os.ReadDir(squatted)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing was written in the squatted directory")

	store := filepath.Join(t.TempDir(), "store")
	ok(t, "serve", "--stdio", "--store", store) // creates the store, mode 0700, and ends at EOF
	fi, err := os.Stat(store)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	require.NoError(t, os.Chmod(store, 0o777))
	fails(t, 1, []string{"store directory " + store + " has mode 0777: group or other users can write it", "chmod 0700 " + store}, "ls", "--store", store)
}
