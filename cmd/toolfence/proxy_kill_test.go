//go:build linux

package main

import (
	"bufio"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestProxyKilledTakesUpstream: when the proxy is SIGKILLed, its stdio child dies with it
// (a parent-death signal) and the host's ends of the proxy's stdout and stderr reach EOF at
// once, since the child writes its stderr into a pipe of the proxy's, not the host's: even
// a process the child left behind (here a background sleep) holds only that pipe.
func TestProxyKilledTakesUpstream(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(bin, "proxy", "--store", t.TempDir(), "--server-id", "mail", "--",
		"sh", "-c", `sleep 300 & echo "upstream pid $$" >&2; exec sleep 300`)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	// The upstream announces itself on stderr, which reaches the host through the proxy.
	lines := bufio.NewScanner(stderr)
	pid := 0
	for pid == 0 && lines.Scan() {
		if rest, ok := strings.CutPrefix(lines.Text(), "upstream pid "); ok {
			pid, err = strconv.Atoi(rest)
			require.NoError(t, err)
		}
	}
	require.NotZero(t, pid, "the upstream never announced itself: %v", lines.Err())
	pidfd, err := unix.PidfdOpen(pid, 0)
	require.NoError(t, err)
	defer unix.Close(pidfd)
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }) // the group: the leftover too

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	eof := func(r io.Reader) chan error {
		ch := make(chan error, 1)
		go func() { _, err := io.Copy(io.Discard, r); ch <- err }()
		return ch
	}
	outEOF, errEOF := eof(stdout), eof(stderr) // what the scanner holds already is not needed

	// A pidfd becomes readable when its process ends (a zombie counts: it runs no more).
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, deadline := 0, time.Now().Add(5*time.Second)
	for left := time.Until(deadline); left > 0; left = time.Until(deadline) {
		if n, err = unix.Poll(fds, int(left.Milliseconds())+1); err != unix.EINTR {
			break // EINTR: a signal of the runtime's own (preemption); poll again
		}
	}
	require.NoError(t, err)
	require.Equal(t, 1, n, "the upstream (pid %d) still runs 5 s after the proxy was killed", pid)

	for name, ch := range map[string]chan error{"stdout": outEOF, "stderr": errEOF} {
		select {
		case err := <-ch:
			require.NoError(t, err, name)
		case <-time.After(5 * time.Second):
			t.Fatalf("the host's end of the proxy's %s is still open 5 s after the proxy was killed", name)
		}
	}
}
