package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/consumer"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

var epoch = time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)

const group = "billing-workers"

// fixture is one test's world: a real badger ledger on a clock, an interceptor, and the
// dead letters the guard reported.
type fixture struct {
	t     *testing.T
	clock lease.Clock
	store ledger.Ledger
	ic    *interceptor.Interceptor

	mu   sync.Mutex
	dead []deadLetter
}

type deadLetter struct {
	msg consumer.Message
	out consumer.Outcome
}

func setup(t *testing.T, clock lease.Clock, dir string) *fixture {
	t.Helper()
	store, err := badger.Open(dir, badger.Options{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	ic, err := interceptor.New(store, interceptor.Options{Holder: "worker", LeaseTTL: 30 * time.Second, Clock: clock})
	require.NoError(t, err)
	return &fixture{t: t, clock: clock, store: store, ic: ic}
}

// guard guards h with the fixture's dead-letter recorder; opts may be zero.
func (f *fixture) guard(h consumer.Handler, opts consumer.Options) *consumer.Guarded {
	f.t.Helper()
	if opts.Group == "" {
		opts.Group = group
	}
	opts.OnDeadLetter = func(ctx context.Context, m consumer.Message, o consumer.Outcome) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.dead = append(f.dead, deadLetter{m, o})
	}
	g, err := consumer.Guard(f.ic, h, opts)
	require.NoError(f.t, err)
	return g
}

func (f *fixture) deadLetters() []deadLetter {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]deadLetter(nil), f.dead...)
}

func (f *fixture) residual(key string) *residual.Residual {
	f.t.Helper()
	r, err := f.store.Get(context.Background(), ledger.GetParams{Namespace: f.ic.Namespace(), Key: key})
	require.NoError(f.t, err)
	return r
}

func (f *fixture) resolve(key string, as residual.State) {
	f.t.Helper()
	_, err := f.store.Resolve(context.Background(), ledger.ResolveParams{
		Namespace: f.ic.Namespace(), Key: key, As: as, By: "ops", Note: "checked the ledger of record",
	})
	require.NoError(f.t, err)
}

// counting is a handler that counts its runs per message key and can be told what to do.
type counting struct {
	runs atomic.Int64
	do   func(m consumer.Message) error
}

func (c *counting) handle(ctx context.Context, m consumer.Message) error {
	c.runs.Add(1)
	if c.do != nil {
		return c.do(m)
	}
	return nil
}

func msg(id, body string) consumer.Message {
	return consumer.Message{ID: id, Subject: "orders", Body: []byte(body)}
}

func TestGuardRejectsBadOptions(t *testing.T) {
	t.Parallel()
	f := setup(t, lease.NewFake(epoch), t.TempDir())
	h := (&counting{}).handle
	for _, tc := range []struct {
		ic   *interceptor.Interceptor
		h    consumer.Handler
		opts consumer.Options
	}{
		{nil, h, consumer.Options{Group: group}},
		{f.ic, nil, consumer.Options{Group: group}},
		{f.ic, h, consumer.Options{}},
		{f.ic, h, consumer.Options{Group: group, RetryAfter: -1}},
	} {
		_, err := consumer.Guard(tc.ic, tc.h, tc.opts)
		require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
	}
}

// A redelivered message is acknowledged without running the handler again.
func TestDuplicateIsAckedWithoutRunning(t *testing.T) {
	t.Parallel()
	f := setup(t, lease.NewFake(epoch), t.TempDir())
	c := &counting{}
	g := f.guard(c.handle, consumer.Options{})

	first := g.Handle(t.Context(), msg("m-1", `{"order":"o-1","amount":5}`))
	require.Equal(t, consumer.Ack, first.Verdict)
	require.True(t, first.Ran)
	require.False(t, first.Duplicate)
	require.Equal(t, 1, first.Attempt)

	again := g.Handle(t.Context(), msg("m-1", `{"amount":5, "order":"o-1"}`))
	require.Equal(t, consumer.Ack, again.Verdict)
	require.True(t, again.Duplicate)
	require.False(t, again.Ran)
	require.Equal(t, first.Key, again.Key)
	require.EqualValues(t, 1, c.runs.Load())

	require.Equal(t, f.ic.Key(group, consumer.DefaultOperation, "m-1"), first.Key, "key = (group, message id)")
	require.Empty(t, f.deadLetters())

	// Another group processes the same message once too.
	other := f.guard(c.handle, consumer.Options{Group: "analytics"})
	require.True(t, other.Handle(t.Context(), msg("m-1", `{"order":"o-1","amount":5}`)).Ran)
	require.EqualValues(t, 2, c.runs.Load())
}

// A business id extractor catches a producer that published the same intent twice.
func TestBusinessKey(t *testing.T) {
	t.Parallel()
	f := setup(t, lease.NewFake(epoch), t.TempDir())
	c := &counting{}
	g := f.guard(c.handle, consumer.Options{Key: orderKey})
	require.True(t, g.Handle(t.Context(), msg("m-1", `{"order":"o-7"}`)).Ran)
	dup := g.Handle(t.Context(), msg("m-2", `{"order":"o-7"}`))
	require.Equal(t, consumer.Ack, dup.Verdict)
	require.True(t, dup.Duplicate)
	require.EqualValues(t, 1, c.runs.Load())

	// No key: never run unguarded.
	nokey := g.Handle(t.Context(), msg("m-3", `{"amount":1}`))
	require.Equal(t, consumer.DeadLetter, nokey.Verdict)
	require.ErrorIs(t, nokey.Err, consumer.ErrNoKey)
	require.False(t, nokey.Ran)
	require.Len(t, f.deadLetters(), 1)
	require.EqualValues(t, 1, c.runs.Load())
}

// orderKey extracts the business id "order:<id>" from a JSON body.
func orderKey(m consumer.Message) (string, error) {
	var body struct {
		Order string `json:"order"`
	}
	if err := json.Unmarshal(m.Body, &body); err != nil {
		return "", err
	}
	if body.Order == "" {
		return "", errors.New("no order id")
	}
	return "order:" + body.Order, nil
}

// A handler that proves it did nothing gets Retry, and the redelivery runs it again.
func TestNoEffectIsRetried(t *testing.T) {
	t.Parallel()
	f := setup(t, lease.NewFake(epoch), t.TempDir())
	fail := true
	c := &counting{do: func(consumer.Message) error {
		if fail {
			return interceptor.NoEffect(errors.New("inventory service refused: try later"))
		}
		return nil
	}}
	g := f.guard(c.handle, consumer.Options{RetryAfter: 3 * time.Second})
	o := g.Handle(t.Context(), msg("m-1", `{}`))
	require.Equal(t, consumer.Retry, o.Verdict)
	require.Equal(t, 3*time.Second, o.RetryAfter)
	require.ErrorIs(t, o.Err, interceptor.ErrCallFailed)
	fail = false
	o = g.Handle(t.Context(), msg("m-1", `{}`))
	require.Equal(t, consumer.Ack, o.Verdict)
	require.Equal(t, 2, o.Attempt)
	require.EqualValues(t, 2, c.runs.Load())
}

// An ambiguous failure or a panic is an unknown outcome: dead-lettered, never acked, and
// every redelivery is blocked until a reconciler settles it.
func TestUnknownOutcomeIsDeadLettered(t *testing.T) {
	t.Parallel()
	for name, do := range map[string]func(consumer.Message) error{
		"error": func(consumer.Message) error { return errors.New("smtp: connection reset after DATA") },
		"panic": func(consumer.Message) error { panic("mailer crashed") },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, lease.NewFake(epoch), t.TempDir())
			c := &counting{do: do}
			g := f.guard(c.handle, consumer.Options{})
			o := g.Handle(t.Context(), msg("m-1", `{"to":"bob"}`))
			require.Equal(t, consumer.DeadLetter, o.Verdict)
			require.True(t, o.Ran)
			require.ErrorIs(t, o.Err, residual.ErrUnknownOutcome)
			require.Equal(t, residual.Unknown, f.residual(o.Key).State)

			again := g.Handle(t.Context(), msg("m-1", `{"to":"bob"}`))
			require.Equal(t, consumer.DeadLetter, again.Verdict)
			require.False(t, again.Ran)
			require.EqualValues(t, 1, c.runs.Load())
			dead := f.deadLetters()
			require.Len(t, dead, 2)
			require.Equal(t, "m-1", dead[1].msg.ID)
			v, ok := errors.AsType[*interceptor.Violation](dead[1].out.Err)
			require.True(t, ok)
			require.Equal(t, interceptor.UnknownOutcome, v.Kind)

			// Reconciled as succeeded: the next redelivery is acknowledged as a duplicate.
			f.resolve(o.Key, residual.Succeeded)
			done := g.Handle(t.Context(), msg("m-1", `{"to":"bob"}`))
			require.Equal(t, consumer.Ack, done.Verdict)
			require.True(t, done.Duplicate)
			require.EqualValues(t, 1, c.runs.Load())
		})
	}
}

// Reconciled as failed, the redelivery runs the handler again.
func TestResolvedFailedRunsAgain(t *testing.T) {
	t.Parallel()
	f := setup(t, lease.NewFake(epoch), t.TempDir())
	var calls atomic.Int64
	c := &counting{do: func(consumer.Message) error {
		if calls.Add(1) == 1 {
			return errors.New("timeout")
		}
		return nil
	}}
	g := f.guard(c.handle, consumer.Options{})
	o := g.Handle(t.Context(), msg("m-1", `{}`))
	require.Equal(t, consumer.DeadLetter, o.Verdict)
	f.resolve(o.Key, residual.Failed)
	o = g.Handle(t.Context(), msg("m-1", `{}`))
	require.Equal(t, consumer.Ack, o.Verdict)
	require.True(t, o.Ran)
	require.EqualValues(t, 2, c.runs.Load())
}

// The same key with another body after success is a payload mismatch: dead-lettered.
func TestPayloadMismatchIsDeadLettered(t *testing.T) {
	t.Parallel()
	f := setup(t, lease.NewFake(epoch), t.TempDir())
	c := &counting{}
	g := f.guard(c.handle, consumer.Options{})
	require.Equal(t, consumer.Ack, g.Handle(t.Context(), msg("m-1", `{"amount":5}`)).Verdict)
	o := g.Handle(t.Context(), msg("m-1", `{"amount":6}`))
	require.Equal(t, consumer.DeadLetter, o.Verdict)
	require.ErrorIs(t, o.Err, residual.ErrPayloadMismatch)
	require.EqualValues(t, 1, c.runs.Load())
	// Raw (non-JSON) bodies are compared byte for byte.
	require.Equal(t, consumer.Ack, g.Handle(t.Context(), msg("m-2", "plain text")).Verdict)
	require.Equal(t, consumer.DeadLetter, g.Handle(t.Context(), msg("m-2", "plain text!")).Verdict)
}

// A redelivery while the first delivery is still in the handler is told to retry later.
func TestConcurrentDeliveryIsRetried(t *testing.T) {
	t.Parallel()
	f := setup(t, lease.NewFake(epoch), t.TempDir())
	entered, release := make(chan struct{}), make(chan struct{})
	c := &counting{do: func(consumer.Message) error {
		close(entered)
		<-release
		return nil
	}}
	g := f.guard(c.handle, consumer.Options{})
	first := make(chan consumer.Outcome, 1)
	go func() { first <- g.Handle(context.Background(), msg("m-1", `{}`)) }()
	<-entered
	o := g.Handle(t.Context(), msg("m-1", `{}`))
	require.Equal(t, consumer.Retry, o.Verdict)
	require.ErrorIs(t, o.Err, residual.ErrInProgress)
	require.Equal(t, time.Second, o.RetryAfter)
	close(release)
	require.Equal(t, consumer.Ack, (<-first).Verdict)
	require.EqualValues(t, 1, c.runs.Load())
}

// The handler sees the dispatch (key and fencing token).
func TestHandlerSeesDispatch(t *testing.T) {
	t.Parallel()
	f := setup(t, lease.NewFake(epoch), t.TempDir())
	var got interceptor.Dispatch
	g := f.guard(func(ctx context.Context, m consumer.Message) error {
		got, _ = interceptor.DispatchFrom(ctx)
		return nil
	}, consumer.Options{})
	o := g.Handle(t.Context(), msg("m-1", `{}`))
	require.Equal(t, o.Key, got.Key)
	require.Equal(t, uint64(1), got.Token)
	require.Equal(t, group, got.Task)
}

func TestVerdictString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "ack", consumer.Ack.String())
	require.Equal(t, "retry", consumer.Retry.String())
	require.Equal(t, "dead-letter", consumer.DeadLetter.String())
	require.Equal(t, "verdict(9)", fmt.Sprint(consumer.Verdict(9)))
}

// A ledger that cannot record the reservation means the handler does not run: Retry.
func TestLedgerDownIsRetried(t *testing.T) {
	t.Parallel()
	f := setup(t, lease.NewFake(epoch), t.TempDir())
	c := &counting{}
	g := f.guard(c.handle, consumer.Options{})
	require.NoError(t, f.store.Close())
	o := g.Handle(t.Context(), msg("m-1", `{}`))
	require.Equal(t, consumer.Retry, o.Verdict)
	require.ErrorIs(t, o.Err, interceptor.ErrNotDispatched)
	require.Zero(t, c.runs.Load())
}
