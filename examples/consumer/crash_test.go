package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/consumer"
	"github.com/toolfence/toolfence/internal/testkit/crashtest"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

const crashEnv = "TOOLFENCE_NATS_CRASH_CONFIG"

// crashConfig is the part of config the child needs, passed as JSON in crashEnv.
type crashConfig struct {
	URL, Stream, Subject, Durable, Store string
	AckWait                              time.Duration
}

// TestCrashChild is the child of TestKilledConsumerIsNotAcked (see internal/testkit/crashtest): a
// JetStream consumer whose handler marks "in-handler <message id>" and hangs until the
// process is killed. It returns at once in a normal test run.
func TestCrashChild(t *testing.T) {
	crashtest.Run(t, map[string]func(t *testing.T){"mid-handler": func(t *testing.T) {
		var cc crashConfig
		require.NoError(t, json.Unmarshal([]byte(os.Getenv(crashEnv)), &cc))
		c := config{url: cc.URL, stream: cc.Stream, subject: cc.Subject, durable: cc.Durable, store: cc.Store, ackWait: cc.AckWait}
		nc, _, cons, err := setup(context.Background(), c)
		require.NoError(t, err)
		defer nc.Close()
		_, ic := openLedger(t, c.store, lease.Real{})
		guard, err := consumer.Guard(ic, func(ctx context.Context, m consumer.Message) error {
			crashtest.Mark("in-handler", m.ID)
			crashtest.Hang()
			return nil
		}, consumer.Options{Group: c.durable, Key: orderKey})
		require.NoError(t, err)
		a := &adapter{guard: guard, hold: time.Minute, log: slog.New(slog.DiscardHandler)}
		_, err = cons.Consume(a.handle)
		require.NoError(t, err)
		crashtest.Hang()
	}})
}

// A consumer SIGKILLed while its handler runs leaves an unknown residual and no
// acknowledgement. JetStream redelivers the message after the ack wait; the new consumer's
// guard blocks it as unknown and dead-letters it (held, not acked) without running the
// handler. Once an operator resolves the residual as succeeded, the next redelivery is
// acknowledged as a duplicate: nothing was billed twice.
func TestKilledConsumerIsNotAcked(t *testing.T) {
	t.Parallel()
	c := testConfig(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	nc, js, cons, err := setup(ctx, c)
	require.NoError(t, err)
	defer nc.Close()
	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: c.subject, Data: []byte(`{"order":"o-1","amount_cents":4200}`),
		Header: nats.Header{jetstream.MsgIDHeader: {"o-1#0"}}})
	require.NoError(t, err)

	raw, err := json.Marshal(crashConfig{URL: c.url, Stream: c.stream, Subject: c.subject, Durable: c.durable, Store: c.store, AckWait: c.ackWait})
	require.NoError(t, err)
	child := crashtest.Start(t, "mid-handler", crashEnv+"="+string(raw))
	require.Equal(t, "o-1#0", child.Await("in-handler"))
	child.Kill()

	// A new consumer an hour later by the ledger's clock: the dead one's lease has expired.
	store, ic := openLedger(t, c.store, lease.NewFake(time.Now().Add(time.Hour)))
	key := ic.Key(c.durable, consumer.DefaultOperation, "order:o-1")
	r, err := store.Get(ctx, ledger.GetParams{Namespace: ic.Namespace(), Key: key})
	require.NoError(t, err)
	require.Equal(t, residual.Unknown, r.State, "the killed consumer left an unknown residual")

	bill := &billing{charges: map[string]int{}}
	dead := make(chan consumer.Outcome, 16)
	guard, err := consumer.Guard(ic, bill.handle, consumer.Options{
		Group: c.durable, Key: orderKey,
		OnDeadLetter: func(ctx context.Context, m consumer.Message, o consumer.Outcome) { dead <- o },
	})
	require.NoError(t, err)
	a := &adapter{guard: guard, hold: c.hold, log: slog.New(slog.DiscardHandler)}
	cc, err := cons.Consume(a.handle)
	require.NoError(t, err)
	defer func() { cc.Drain(); <-cc.Closed() }()

	var o consumer.Outcome
	select {
	case o = <-dead:
	case <-ctx.Done():
		t.Fatal("the redelivery never reached the dead-letter hook")
	}
	require.ErrorIs(t, o.Err, residual.ErrUnknownOutcome)
	require.False(t, o.Ran)
	require.Equal(t, key, o.Key)
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.AckFloor.Stream, "the message was never acknowledged")
	require.Equal(t, 1, info.NumAckPending)

	_, err = store.Resolve(ctx, ledger.ResolveParams{Namespace: ic.Namespace(), Key: key, As: residual.Succeeded,
		By: "ops", Note: "the payment provider shows the charge"})
	require.NoError(t, err)
	require.NoError(t, waitDrained(ctx, cons))
	info, err = cons.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, info.AckFloor.Stream, "acknowledged once reconciled")
	require.EqualValues(t, 1, a.duplicates.Load())
	charged, _ := bill.counts()
	require.Zero(t, charged, "the order was not billed a second time")
}
