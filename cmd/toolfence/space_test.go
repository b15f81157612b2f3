//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
)

// TestCommandsOnFullFilesystem: on a real tmpfs filled to the last byte, ls on an existing
// store fails with a clear error (no SIGBUS in badger: the binary runs as its own process,
// so a crash would show as a signal) and writes nothing; once space is freed it works.
// Off root (no mount) the test skips, under CI=true it fails: CI runs it as root.
func TestCommandsOnFullFilesystem(t *testing.T) {
	testkit.NeedRoot(t, "to mount a small tmpfs")
	t.Parallel()
	mnt := filepath.Join(t.TempDir(), "fs")
	require.NoError(t, os.Mkdir(mnt, 0o700))
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=128m,mode=0700", "tmpfs", mnt).CombinedOutput()
	require.NoError(t, err, "mount: %s", out)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	store := filepath.Join(mnt, "store")
	ok(t, "serve", "--stdio", "--store", store) // creates the store, ends at EOF

	ballast := filepath.Join(mnt, "ballast")
	f, err := os.Create(ballast)
	require.NoError(t, err)
	chunk := make([]byte, 1<<20)
	for i := 0; ; i++ {
		require.Less(t, i, 1024, "a 128 MiB filesystem took more than 1 GiB")
		if _, err := f.Write(chunk); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			break
		}
	}
	require.NoError(t, f.Close())

	r := tf(t, nil, "ls", "--store", store)
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, "low on free space")
	require.Contains(t, r.stderr, fmt.Sprintf("open %s: ", store))
	require.Contains(t, r.stderr, "needs at least 56 MiB to open")

	require.NoError(t, os.Remove(ballast))
	ok(t, "ls", "--store", store)
}
