package remote_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/ledger/ledgertest"
	"github.com/toolfence/toolfence/ledger/remote"
	"github.com/toolfence/toolfence/residual"
)

// roleEnv makes the test binary a child process that owns a store (see TestMain).
const roleEnv = testkit.RoleEnv

// shortDir returns a new directory with a short path (a unix socket path holds at most 107
// bytes), removed at cleanup.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tfs")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// sharedOpts opens the badger store in dir on clock (the real one when nil).
func sharedOpts(dir string, clock lease.Clock) remote.SharedOptions {
	return remote.SharedOptions{
		Socket: filepath.Join(dir, "toolfence.sock"),
		Open:   func() (ledger.Ledger, error) { return badger.Open(dir, badger.Options{Clock: clock}) },
		Locked: func(err error) bool { return errors.Is(err, badger.ErrLocked) },
		Wait:   5 * time.Second,
	}
}

func openShared(t *testing.T, opts remote.SharedOptions) *remote.Shared {
	t.Helper()
	s, err := remote.OpenShared(t.Context(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// The whole suite through a guest: the owner (the first Shared) serves the store on its
// socket, the second Shared finds the store locked and goes through the socket.
func TestConformanceSharedGuest(t *testing.T) {
	ledgertest.Run(t, ledgertest.Harness{Open: func(t *testing.T) ledgertest.Fixture {
		dir := shortDir(t)
		clock := lease.NewFake(start)
		owner := openShared(t, sharedOpts(dir, clock))
		require.True(t, owner.Owner())
		guest := openShared(t, sharedOpts(dir, clock))
		require.False(t, guest.Owner(), "the store is held: the second opener is a guest")
		return ledgertest.Fixture{
			Ledger:  guest,
			Advance: func(_ *testing.T, d time.Duration) { clock.Advance(d) },
			Now:     func(*testing.T) time.Time { return clock.Now() },
		}
	}})
}

// The socket is private (0600); a stale socket left by a dead owner is replaced; badger
// opens a store that holds the socket.
func TestSocketIsPrivateAndStaleOneReplaced(t *testing.T) {
	dir := shortDir(t)
	opts := sharedOpts(dir, nil)
	require.NoError(t, os.WriteFile(opts.Socket, []byte("stale"), 0o644))
	s := openShared(t, opts)
	require.True(t, s.Owner())
	fi, err := os.Stat(opts.Socket)
	require.NoError(t, err)
	require.Equal(t, os.ModeSocket, fi.Mode().Type())
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.NoError(t, s.Close())
	_, err = os.Stat(opts.Socket)
	require.ErrorIs(t, err, os.ErrNotExist, "a closed owner removes its socket")

	// badger reopens a store directory that holds a (stale) socket.
	require.NoError(t, os.WriteFile(opts.Socket, nil, 0o600))
	s2 := openShared(t, opts)
	require.True(t, s2.Owner())
}

// A store whose socket path is longer than a unix socket address takes is shared all the
// same (through /proc/self/fd on Linux).
func TestLongSocketPath(t *testing.T) {
	dir := filepath.Join(shortDir(t), strings.Repeat("d", 60), strings.Repeat("e", 60))
	require.NoError(t, os.MkdirAll(dir, 0o700))
	owner := openShared(t, sharedOpts(dir, nil))
	require.True(t, owner.Owner())
	guest := openShared(t, sharedOpts(dir, nil))
	require.False(t, guest.Owner())
	_, err := guest.Reserve(t.Context(), reserveParams("ns", "long"))
	require.NoError(t, err)
	got, err := owner.Get(t.Context(), ledger.GetParams{Namespace: "ns", Key: reserveParams("ns", "long").Key})
	require.NoError(t, err)
	require.Equal(t, residual.Pending, got.State)
}

// When the owner closes, a guest's next call takes the store over; what was recorded
// through either stays.
func TestGuestTakesOverFromClosedOwner(t *testing.T) {
	dir := shortDir(t)
	ctx := t.Context()
	owner := openShared(t, sharedOpts(dir, nil))
	guest := openShared(t, sharedOpts(dir, nil))
	a := reserveParams("ns", "a")
	res, err := guest.Reserve(ctx, a)
	require.NoError(t, err)
	_, err = guest.Commit(ctx, ledger.CommitParams{Namespace: "ns", Key: a.Key, Holder: "h", Token: res.Lease.Token, Outcome: residual.Succeeded})
	require.NoError(t, err)
	got, err := owner.Get(ctx, ledger.GetParams{Namespace: "ns", Key: a.Key})
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, got.State, "the owner sees the guest's commit")

	watch, err := guest.Watch(ctx, "ns")
	require.NoError(t, err)
	require.NoError(t, owner.Close())
	for range watch {
	} // the stream through the old owner ends

	got, err = guest.Get(ctx, ledger.GetParams{Namespace: "ns", Key: a.Key})
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, got.State)
	require.True(t, guest.Owner(), "the guest took the store over")
	third := openShared(t, sharedOpts(dir, nil))
	require.False(t, third.Owner())
	got, err = third.Get(ctx, ledger.GetParams{Namespace: "ns", Key: a.Key})
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, got.State, "a new guest reaches the new owner")
}

// A store held by a process that serves no socket: the guest gives up after Wait with an
// error that says so and wraps badger.ErrLocked.
func TestHeldWithoutOwnerFailsAfterWait(t *testing.T) {
	dir := shortDir(t)
	b, err := badger.Open(dir, badger.Options{})
	require.NoError(t, err)
	defer b.Close()
	opts := sharedOpts(dir, nil)
	opts.Wait = 200 * time.Millisecond
	_, err = remote.OpenShared(t.Context(), opts)
	require.ErrorIs(t, err, ledger.ErrUnavailable)
	require.ErrorIs(t, err, badger.ErrLocked)
	require.Contains(t, err.Error(), "did not answer on "+opts.Socket)
}

// blocking holds a Reserve of target "block" until the process dies, after telling so.
type blocking struct{ ledger.Ledger }

func (b blocking) Reserve(ctx context.Context, p ledger.ReserveParams) (*ledger.ReserveResult, error) {
	if p.Target == "block" {
		fmt.Println("blocked")
		select {}
	}
	return b.Ledger.Reserve(ctx, p)
}

// runOwner is the owner process of the SIGKILL tests (the test binary re-executed with
// $TOOLFENCE_REMOTE_TEST_ROLE=owner, see TestMain): it owns the store in
// $TOOLFENCE_REMOTE_TEST_DIR, says "ready" and serves until killed.
func runOwner() {
	opts := sharedOpts(os.Getenv("TOOLFENCE_REMOTE_TEST_DIR"), nil)
	open := opts.Open
	opts.Open = func() (ledger.Ledger, error) {
		l, err := open()
		if err != nil {
			return nil, err
		}
		return blocking{l}, nil
	}
	s, err := remote.OpenShared(context.Background(), opts)
	if err != nil || !s.Owner() {
		fmt.Println("not owner:", err)
		os.Exit(3)
	}
	fmt.Println("ready")
	select {}
}

// startOwner runs the owner process (runOwner) on dir and waits for its "ready".
func startOwner(t *testing.T, dir string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), roleEnv+"=owner", "TOOLFENCE_REMOTE_TEST_DIR="+dir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	require.True(t, sc.Scan(), "owner child said nothing")
	require.Equal(t, "ready", sc.Text())
	return cmd, sc
}

// The owner process is SIGKILLed: a mutating call in flight through it answers
// ErrOutcomeUnknown, and the guest's next call takes the store over with everything
// recorded before.
func TestOwnerKilled(t *testing.T) {
	dir := shortDir(t)
	ctx := t.Context()
	cmd, out := startOwner(t, dir)
	guest := openShared(t, sharedOpts(dir, nil))
	require.False(t, guest.Owner())

	a := reserveParams("ns", "a")
	res, err := guest.Reserve(ctx, a)
	require.NoError(t, err)
	_, err = guest.Commit(ctx, ledger.CommitParams{Namespace: "ns", Key: a.Key, Holder: "h", Token: res.Lease.Token, Outcome: residual.Succeeded, Result: []byte(`{"ok":1}`)})
	require.NoError(t, err)

	inFlight := make(chan error, 1)
	go func() {
		_, err := guest.Reserve(ctx, reserveParams("ns", "block"))
		inFlight <- err
	}()
	require.True(t, out.Scan())
	require.Equal(t, "blocked", out.Text(), "the owner is inside the step")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	err = <-inFlight
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown, "the answer of a step in flight was lost with its owner")

	res, err = guest.Reserve(ctx, reserveParams("ns", "after"))
	require.NoError(t, err, "the first step after the kill (a mutating one) moves to the store, not unknown")
	require.Equal(t, ledger.Acquired, res.Decision)
	got, err := guest.Get(ctx, ledger.GetParams{Namespace: "ns", Key: a.Key})
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, got.State, "what the old owner recorded survives")
	require.JSONEq(t, `{"ok":1}`, string(got.Result))
	require.True(t, guest.Owner(), "the guest took the store over")
	res, err = guest.Reserve(ctx, reserveParams("ns", "b"))
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, res.Decision)
}
