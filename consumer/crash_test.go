package consumer_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/consumer"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

const crashDirEnv = "TOOLFENCE_CONSUMER_CRASH_DIR"

// TestCrashHelper is the child of TestConsumerKilledMidHandler: a consumer that takes one
// delivery, announces that it is in the handler and blocks until it is killed. It prints
// "ack <id>" for every delivery it would acknowledge. It returns at once in a normal run.
func TestCrashHelper(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		return
	}
	store, err := badger.Open(dir, badger.Options{})
	require.NoError(t, err)
	ic, err := interceptor.New(store, interceptor.Options{Holder: "doomed-worker", LeaseTTL: 2 * time.Second})
	require.NoError(t, err)
	g, err := consumer.Guard(ic, func(ctx context.Context, m consumer.Message) error {
		fmt.Println("in-handler", m.ID)
		_, _ = io.Copy(io.Discard, os.Stdin) // block until killed (or the parent goes away)
		os.Exit(3)
		return nil
	}, consumer.Options{Group: group})
	require.NoError(t, err)
	if o := g.Handle(context.Background(), msg("m-1", `{"to":"bob","subject":"invoice"}`)); o.Verdict == consumer.Ack {
		fmt.Println("ack", "m-1")
	}
}

// A consumer SIGKILLed in the middle of its handler leaves an unknown residual and no
// acknowledgement; the redelivery to a new consumer is blocked and dead-lettered, and
// runs again only after a reconciler resolves the residual as failed.
func TestConsumerKilledMidHandler(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan(), "child did not reach the handler")
	require.Equal(t, "in-handler m-1", lines.Text())
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	var rest []string
	for lines.Scan() {
		rest = append(rest, lines.Text())
	}
	_ = cmd.Wait()
	require.Empty(t, rest, "the killed consumer acknowledged nothing")

	// The broker redelivers to a new consumer an hour later (the dead one's lease expired).
	f := setup(t, lease.NewFake(time.Now().Add(time.Hour)), dir)
	c := &counting{}
	g := f.guard(c.handle, consumer.Options{})
	key := f.ic.Key(group, consumer.DefaultOperation, "m-1")
	r := f.residual(key)
	require.Equal(t, residual.Unknown, r.State)
	require.Equal(t, "doomed-worker", r.Current().Holder)

	o := g.Handle(t.Context(), msg("m-1", `{"to":"bob","subject":"invoice"}`))
	require.Equal(t, consumer.DeadLetter, o.Verdict)
	require.ErrorIs(t, o.Err, residual.ErrUnknownOutcome)
	require.False(t, o.Ran)
	require.Len(t, f.deadLetters(), 1)
	require.Zero(t, c.runs.Load())

	f.resolve(key, residual.Failed) // the mail server has no record of it
	o = g.Handle(t.Context(), msg("m-1", `{"to":"bob","subject":"invoice"}`))
	require.Equal(t, consumer.Ack, o.Verdict)
	require.True(t, o.Ran)
	require.Equal(t, 2, o.Attempt)
	require.EqualValues(t, 1, c.runs.Load())
}
