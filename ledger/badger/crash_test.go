package badger

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit/crashtest"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// The crash tests re-execute this test binary as a child (internal/testkit/crashtest) that runs
// TestCrashChild in a role. The child marks a step only after the step returned, then
// hangs until it is killed; the parent SIGKILLs it and reopens the store, so whatever the
// child marked must be there.
const (
	// crashRoleEnv is set in the child only (TestMain skips its leak check there).
	crashRoleEnv = crashtest.RoleEnv
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

// TestCrashChild is the child's side; it returns at once in a normal test run.
func TestCrashChild(t *testing.T) {
	crashtest.Run(t, map[string]func(t *testing.T){
		"reserve": func(t *testing.T) { crashChild(t, false) },
		"commit":  func(t *testing.T) { crashChild(t, true) },
	})
}

// crashChild reserves the crash key (and, with commit, commits it), marks "reserved" or
// "committed" once that returned, and hangs until it is killed.
func crashChild(t *testing.T, commit bool) {
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
	if !commit {
		crashtest.Mark("reserved", "")
		crashtest.Hang()
	}
	_, err = l.Commit(ctx, ledger.CommitParams{
		Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
		Outcome: residual.Succeeded, Result: crashResult, Margin: time.Second,
	})
	require.NoError(t, err)
	crashtest.Mark("committed", "")
	crashtest.Hang()
}

// runCrashChild starts the child for role, waits for its mark, checks that the store is
// locked by it, and kills it with SIGKILL.
func runCrashChild(t *testing.T, dir, role string, mode SyncMode, mark string) {
	child := crashtest.Start(t, role, crashDirEnv+"="+dir, crashModeEnv+"="+mode.String())
	child.Await(mark)
	_, err := Open(dir, Options{})
	require.ErrorIs(t, err, ErrLocked, "the child holds the store")
	child.Kill()
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
