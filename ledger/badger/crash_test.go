package badger

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// The crash tests re-execute this test binary as a child that runs TestCrashHelper with a
// role. The child acknowledges a step on stdout only after the step returned, then blocks
// until it is killed; the parent SIGKILLs it and reopens the store, so whatever the child
// acknowledged must be there.
const (
	crashRoleEnv = "TOOLFENCE_CRASH_ROLE"
	crashDirEnv  = "TOOLFENCE_CRASH_DIR"
	crashModeEnv = "TOOLFENCE_CRASH_MODE"
)

var crashResult = []byte(`{"charge":"ch_crash"}`)

func crashParams() ledger.ReserveParams {
	p := reserveParams("crash")
	p.Holder = "child"
	p.TTL = time.Hour
	return p
}

// TestCrashHelper is the child's side; it returns at once in a normal test run.
func TestCrashHelper(t *testing.T) {
	role := os.Getenv(crashRoleEnv)
	if role == "" {
		return
	}
	mode := GroupCommit
	if os.Getenv(crashModeEnv) == SyncWrites.String() {
		mode = SyncWrites
	}
	l, err := Open(os.Getenv(crashDirEnv), Options{Sync: mode})
	require.NoError(t, err)
	ctx := context.Background()
	p := crashParams()
	res, err := l.Reserve(ctx, p)
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, res.Decision)
	if role == "commit" {
		_, err := l.Commit(ctx, ledger.CommitParams{
			Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
			Outcome: residual.Succeeded, Result: crashResult, Margin: time.Second,
		})
		require.NoError(t, err)
		fmt.Println("committed")
	} else {
		fmt.Println("reserved")
	}
	// Block until killed. If the parent dies instead, stdin closes and the child exits.
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(3)
}

// runCrashChild starts the child for role, waits for its acknowledgement line, checks that
// the store is locked by it, and kills it with SIGKILL.
func runCrashChild(t *testing.T, dir, role string, mode SyncMode, ack string) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashRoleEnv+"="+role, crashDirEnv+"="+dir, crashModeEnv+"="+mode.String())
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())

	lines := bufio.NewScanner(stdout)
	var seen []string
	acked := false
	for !acked && lines.Scan() {
		acked = lines.Text() == ack
		seen = append(seen, lines.Text())
	}
	if !acked {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child never acknowledged %q; stdout %q, stderr %s", ack, seen, stderr.String())
	}

	_, err = Open(dir, Options{})
	require.ErrorIs(t, err, ErrLocked, "the child holds the store")

	require.NoError(t, syscall.Kill(cmd.Process.Pid, syscall.SIGKILL))
	err = cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	status, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, status.Signaled(), "child was killed, not exited: %v; stderr %s", err, stderr.String())
	require.Equal(t, syscall.SIGKILL, status.Signal())
}

func TestCrashAfterReserve(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			runCrashChild(t, dir, "reserve", mode, "reserved")

			l := openTest(t, dir, Options{Sync: mode})
			p := crashParams()
			r, err := l.Get(t.Context(), ledger.GetParams{Namespace: p.Namespace, Key: p.Key})
			require.NoError(t, err, "an acknowledged reserve survives SIGKILL")
			require.Equal(t, residual.Pending, r.State)
			require.Equal(t, uint64(1), r.Token)
			require.Len(t, r.Attempts, 1)
			require.Equal(t, 1, r.Attempts[0].N)
			require.Equal(t, "child", r.Attempts[0].Holder)

			res, err := l.Reserve(t.Context(), p)
			require.NoError(t, err)
			require.Equal(t, ledger.InProgress, res.Decision, "the dead child's lease still holds the key")
		})
	}
}

func TestCrashAfterCommit(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			runCrashChild(t, dir, "commit", mode, "committed")

			l := openTest(t, dir, Options{Sync: mode})
			p := crashParams()
			r, err := l.Get(t.Context(), ledger.GetParams{Namespace: p.Namespace, Key: p.Key})
			require.NoError(t, err)
			require.Equal(t, residual.Succeeded, r.State, "an acknowledged commit survives SIGKILL")
			require.Equal(t, crashResult, r.Result)
			require.True(t, r.Current().Released)

			res, err := l.Reserve(t.Context(), p)
			require.NoError(t, err)
			require.Equal(t, ledger.Replay, res.Decision)
		})
	}
}
