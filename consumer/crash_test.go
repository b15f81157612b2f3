package consumer_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/consumer"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/testkit/crashtest"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

const crashDirEnv = "TOOLFENCE_CONSUMER_CRASH_DIR"

// TestCrashChild is the child of TestConsumerKilledMidHandler (see internal/testkit/crashtest): a
// consumer that takes one delivery, marks "in-handler" and hangs in the handler until it is
// killed. It marks "ack" for every delivery it would acknowledge. It returns at once in a
// normal run.
func TestCrashChild(t *testing.T) {
	crashtest.Run(t, map[string]func(t *testing.T){"mid-handler": func(t *testing.T) {
		store, err := badger.Open(os.Getenv(crashDirEnv), badger.Options{})
		require.NoError(t, err)
		ic, err := interceptor.New(store, interceptor.Options{Holder: "doomed-worker", LeaseTTL: 2 * time.Second})
		require.NoError(t, err)
		g, err := consumer.Guard(ic, func(ctx context.Context, m consumer.Message) error {
			crashtest.Mark("in-handler", m.ID)
			crashtest.Hang()
			return nil
		}, consumer.Options{Group: group})
		require.NoError(t, err)
		if o := g.Handle(context.Background(), msg("m-1", `{"to":"bob","subject":"invoice"}`)); o.Verdict == consumer.Ack {
			crashtest.Mark("ack", "m-1")
		}
	}})
}

// A consumer SIGKILLed in the middle of its handler leaves an unknown residual and no
// acknowledgement; the redelivery to a new consumer is blocked and dead-lettered, and
// runs again only after a reconciler resolves the residual as failed.
func TestConsumerKilledMidHandler(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	child := crashtest.Start(t, "mid-handler", crashDirEnv+"="+dir)
	require.Equal(t, "m-1", child.Await("in-handler"))
	rest := child.Kill()
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
