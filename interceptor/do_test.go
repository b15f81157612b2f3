package interceptor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// Malformed calls get a named error before anything is reserved: the tool never runs and
// the ledger holds no residual.
func TestDoRefusesMalformedCalls(t *testing.T) {
	t.Parallel()
	big := `{"blob":"` + strings.Repeat("x", interceptor.DefaultMaxArgs) + `"}`
	cases := []struct {
		name    string
		ctx     func(*fixture) context.Context
		call    interceptor.Call
		want    error
		mention string
	}{
		{"no task", func(*fixture) context.Context { return context.Background() }, charge(chargeArgs), interceptor.ErrNoTask, "task"},
		{"empty task", func(*fixture) context.Context { return interceptor.WithTask(context.Background(), "") }, charge(chargeArgs), interceptor.ErrNoTask, "task"},
		{"empty operation", nil, interceptor.Call{Target: "invoice:INV-42", Args: json.RawMessage(chargeArgs)}, interceptor.ErrInvalidCall, "operation"},
		{"empty target", nil, interceptor.Call{Operation: "payments.charge", Args: json.RawMessage(chargeArgs)}, interceptor.ErrInvalidCall, "target"},
		{"truncated JSON", nil, charge(`{"amount":`), interceptor.ErrInvalidCall, "args"},
		{"not JSON", nil, charge(`amount=1200`), interceptor.ErrInvalidCall, "args"},
		{"trailing garbage", nil, charge(`{"amount":1} {}`), interceptor.ErrInvalidCall, "args"},
		{"args over 1 MiB", nil, charge(big), interceptor.ErrArgsTooLarge, "1048576"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			ctx := f.ctx
			if c.ctx != nil {
				ctx = c.ctx(f)
			}
			tl := answering(ok(`{}`), nil)
			res, err := f.ic.Do(ctx, c.call, tl.fn)
			require.ErrorIs(t, err, c.want)
			require.Contains(t, err.Error(), c.mention, "the error names what is wrong")
			var v *interceptor.Violation
			require.False(t, errors.As(err, &v), "a malformed call is not a violation")
			require.Nil(t, res)
			require.Zero(t, tl.count(), "the tool must not run")
			require.Empty(t, f.list(), "nothing may be written for a malformed call")
		})
	}
}

// MaxArgs is a byte limit on the raw args: exactly the limit passes, one byte more does not.
func TestDoMaxArgsBoundary(t *testing.T) {
	t.Parallel()
	f := setup(t, withConfig(func(c *interceptor.Options) { c.MaxArgs = 32 }))
	exact := `{"pad":"` + strings.Repeat("x", 32-len(`{"pad":""}`)) + `"}`
	require.Len(t, exact, 32)
	tl := answering(ok(`{}`), nil)

	_, err := f.ic.Do(f.ctx, interceptor.Call{Operation: "op", Target: "t-1", Args: json.RawMessage(exact + " ")}, tl.fn)
	require.ErrorIs(t, err, interceptor.ErrArgsTooLarge)
	require.Zero(t, tl.count())

	res, err := f.ic.Do(f.ctx, interceptor.Call{Operation: "op", Target: "t-2", Args: json.RawMessage(exact)}, tl.fn)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 1, tl.count())
}

// A nil tool is refused as an invalid call, before anything is reserved.
func TestDoRefusesNilTool(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, err := f.ic.Do(f.ctx, charge(chargeArgs), nil)
	require.ErrorIs(t, err, interceptor.ErrInvalidCall)
	require.Empty(t, f.list())
}

// Empty args mean {}: a call without args and a call with {} share a digest and replay.
func TestDoEmptyArgsAreEmptyObject(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tl := answering(ok(`{"sent":true}`), nil)
	call := interceptor.Call{Operation: "email.send", Target: "email:bob@example.com"}
	res, err := f.ic.Do(f.ctx, call, tl.fn)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	call.Args = json.RawMessage(` { } `)
	res, err = f.ic.Do(f.ctx, call, tl.fn)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, 1, tl.count())
}

// A success runs the tool once, with the key and token it must forward; the second call
// replays byte for byte without running the tool; semantically equal args replay too;
// different args are a payload mismatch that carries the first result.
func TestDoSucceedsOnceThenReplays(t *testing.T) {
	t.Parallel()
	f := setup(t)
	body := `{"charge":"ch_1", "amount": 1200}` // deliberately not canonical: bytes must survive
	tl := answering(ok(body), nil)
	key := f.key("payments.charge", "invoice:INV-42")

	res, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.NoError(t, err)
	require.Equal(t, key, res.Key)
	require.False(t, res.Replayed)
	require.Equal(t, residual.Succeeded, res.State)
	require.Equal(t, 1, res.Attempt)
	require.Equal(t, uint64(1), res.Token)
	require.Equal(t, []byte(body), res.Output)
	require.Equal(t, sha([]byte(body)), res.ResultDigest)
	require.False(t, res.Truncated)
	require.Equal(t, 1, tl.count())

	d := tl.dispatches()[0]
	require.Equal(t, interceptor.Dispatch{
		Key: key, Token: 1, Attempt: 1, Task: testTask, Operation: "payments.charge",
		Target: "invoice:INV-42", Args: json.RawMessage(chargeArgs),
	}, d)

	r := f.get(key)
	require.Equal(t, residual.Succeeded, r.State)
	require.Equal(t, []byte(body), r.Result)
	require.Len(t, r.Attempts, 1)
	require.Equal(t, residual.Succeeded, r.Attempts[0].Outcome)
	require.Equal(t, holderA, r.Attempts[0].Holder)
	require.True(t, r.Attempts[0].Released, "the commit releases the lease")

	again, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.True(t, bytes.Equal([]byte(body), again.Output), "replay is byte-for-byte: %s", again.Output)
	require.Equal(t, 1, again.Attempt)
	require.Equal(t, uint64(1), again.Token)
	require.Equal(t, residual.Succeeded, again.State)
	require.Equal(t, res.ResultDigest, again.ResultDigest)
	require.Equal(t, key, again.Key)
	require.Equal(t, 1, tl.count(), "a replay must not run the tool")

	// Reordered keys, whitespace and 1200.0 for 1200: the same intent, so a replay.
	reordered, err := f.ic.Do(f.ctx, charge(`{ "currency" : "eur", "amount" : 1200.0 }`), tl.fn)
	require.NoError(t, err)
	require.True(t, reordered.Replayed)
	require.Equal(t, []byte(body), reordered.Output)
	require.Equal(t, 1, tl.count())

	// Other args on the same (task, operation, target): refused, the first result stands.
	_, err = f.ic.Do(f.ctx, charge(`{"amount":1300,"currency":"eur"}`), tl.fn)
	v := requireViolation(t, err, interceptor.PayloadMismatch, key)
	require.Equal(t, []byte(body), v.Result, "a payload mismatch carries the first result")
	require.Equal(t, residual.Succeeded, v.State)
	require.Equal(t, 1, v.Attempt)
	require.Equal(t, holderA, v.Holder)
	require.Equal(t, 1, tl.count())
	require.Equal(t, residual.Succeeded, f.get(key).State)
}

// Another task, target or operation is another key and runs on its own.
func TestDoKeysComeFromIntent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tl := answering(ok(`{}`), nil)
	calls := []struct {
		task string
		call interceptor.Call
	}{
		{testTask, charge(chargeArgs)},
		{"run-43", charge(chargeArgs)},
		{testTask, interceptor.Call{Operation: "payments.charge", Target: "invoice:INV-43", Args: json.RawMessage(chargeArgs)}},
		{testTask, interceptor.Call{Operation: "payments.refund", Target: "invoice:INV-42", Args: json.RawMessage(chargeArgs)}},
	}
	keys := map[string]bool{}
	for _, c := range calls {
		res, err := f.ic.Do(interceptor.WithTask(context.Background(), c.task), c.call, tl.fn)
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.Equal(t, f.ic.Key(c.task, c.call.Operation, c.call.Target), res.Key)
		keys[res.Key] = true
	}
	require.Len(t, keys, len(calls))
	require.Equal(t, len(calls), tl.count())
}

// A tool error that wraps NoEffect is a failed attempt: ErrCallFailed with the result, the
// residual is failed, and the next call runs attempt 2 under token 2 with the same key.
func TestDoNoEffectFailsAndRetries(t *testing.T) {
	t.Parallel()
	f := setup(t)
	key := f.key("payments.charge", "invoice:INV-42")
	declined := errors.New("card declined")
	first := true
	tl := newTool(func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
		if first {
			first = false
			return interceptor.Response{Status: 402, Body: []byte(`{"error":"declined"}`)}, interceptor.NoEffect(declined)
		}
		return ok(`{"charge":"ch_2"}`), nil
	})

	res, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.ErrorIs(t, err, interceptor.ErrCallFailed)
	require.ErrorIs(t, err, interceptor.ErrNoEffect)
	require.ErrorIs(t, err, declined, "the tool's error is kept")
	var v *interceptor.Violation
	require.False(t, errors.As(err, &v), "a confirmed failure is not a violation")
	require.NotNil(t, res, "a failed call still says what happened")
	require.Equal(t, residual.Failed, res.State)
	require.Equal(t, 1, res.Attempt)
	require.Equal(t, uint64(1), res.Token)
	require.Equal(t, []byte(`{"error":"declined"}`), res.Output)
	require.False(t, res.Replayed)

	r := f.get(key)
	require.Equal(t, residual.Failed, r.State)
	require.Equal(t, residual.Failed, r.Attempts[0].Outcome)
	require.Contains(t, r.Attempts[0].Error, "card declined")

	res, err = f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 2, res.Attempt)
	require.Equal(t, uint64(2), res.Token)
	require.Equal(t, 2, tl.count())
	ds := tl.dispatches()
	require.Equal(t, ds[0].Key, ds[1].Key, "a retry keeps the key")
	require.Equal(t, uint64(2), ds[1].Token)
	require.Equal(t, 2, ds[1].Attempt)
	r = f.get(key)
	require.Equal(t, residual.Succeeded, r.State)
	require.Len(t, r.Attempts, 2)
}

// HTTP answers: 400 and 422 were refused before any effect (failed, retryable); 408, 409,
// 429 and 5xx may have had an effect (unknown, blocking).
func TestDoClassifiesHTTPStatus(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status int
		want   residual.State
	}{
		{400, residual.Failed}, {422, residual.Failed},
		{408, residual.Unknown}, {409, residual.Unknown}, {429, residual.Unknown},
		{500, residual.Unknown}, {502, residual.Unknown}, {503, residual.Unknown}, {504, residual.Unknown},
	} {
		t.Run(fmt.Sprint(c.status), func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			key := f.key("payments.charge", "invoice:INV-42")
			body := fmt.Sprintf(`{"code":%d}`, c.status)
			tl := answering(interceptor.Response{Status: c.status, Body: []byte(body)}, nil)
			res, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
			require.Equal(t, c.want, f.get(key).State)
			switch c.want {
			case residual.Failed:
				require.ErrorIs(t, err, interceptor.ErrCallFailed)
				require.Equal(t, residual.Failed, res.State)
				require.Equal(t, []byte(body), res.Output)
				_, err = f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
				require.ErrorIs(t, err, interceptor.ErrCallFailed)
				require.Equal(t, 2, tl.count(), "a failed attempt may be retried")
			default:
				requireViolation(t, err, interceptor.UnknownOutcome, key)
				require.Equal(t, residual.Unknown, res.State)
				require.Equal(t, []byte(body), res.Output)
				_, err = f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
				requireViolation(t, err, interceptor.UnknownOutcome, key)
				require.Equal(t, 1, tl.count(), "an unknown outcome blocks: the tool must not run again")
			}
		})
	}
}

// Fail closed: when the reservation cannot be written, nothing is dispatched.
func TestDoFailsClosedWhenReserveFails(t *testing.T) {
	t.Parallel()
	diskFull := errors.New("disk full")
	f := setup(t, withLedger(func(l ledger.Ledger) ledger.Ledger {
		return &flakyLedger{Ledger: l, reserveErr: diskFull}
	}))
	tl := answering(ok(`{}`), nil)
	res, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.Nil(t, res)
	require.ErrorIs(t, err, interceptor.ErrNotDispatched)
	require.ErrorIs(t, err, diskFull, "the ledger's error is kept")
	require.Zero(t, tl.count(), "fail closed: the tool must not run")
	require.Empty(t, f.list())
}

// A cancelled caller context that stops the reservation stops the dispatch too.
func TestDoFailsClosedOnCancelledContext(t *testing.T) {
	t.Parallel()
	f := setup(t, withLedger(func(l ledger.Ledger) ledger.Ledger {
		return &flakyLedger{Ledger: l, reserveErr: context.Canceled}
	}))
	tl := answering(ok(`{}`), nil)
	_, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.ErrorIs(t, err, interceptor.ErrNotDispatched)
	require.Zero(t, tl.count())
}

// When the tool ran but its outcome cannot be committed, the call is not a success: the
// caller gets UnknownOutcome with what the tool returned, and the key stays blocked.
func TestDoCommitFailureIsUnknownNeverSuccess(t *testing.T) {
	t.Parallel()
	ioErr := errors.New("i/o error")
	fl := &flakyLedger{commitErr: ioErr}
	f := setup(t, withLedger(func(l ledger.Ledger) ledger.Ledger { fl.Ledger = l; return fl }))
	key := f.key("payments.charge", "invoice:INV-42")
	tl := answering(ok(`{"charge":"ch_1"}`), nil)

	res, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.Nil(t, res)
	v := requireViolation(t, err, interceptor.UnknownOutcome, key)
	require.ErrorIs(t, err, ioErr)
	require.Equal(t, []byte(`{"charge":"ch_1"}`), v.Result, "the caller learns what the tool returned")
	require.Equal(t, 1, tl.count())

	// The lease is still held by the failed commit; once it expires the key reads unknown.
	f.clock.Advance(testTTL + 1)
	require.Equal(t, residual.Unknown, f.get(key).State)
	_, err = f.successor().Do(f.ctx, charge(chargeArgs), tl.fn)
	requireViolation(t, err, interceptor.UnknownOutcome, key)
	require.Equal(t, 1, tl.count())
}

// New rejects unusable settings loudly and fills defaults.
func TestNewOptions(t *testing.T) {
	t.Parallel()
	l := openBadger(t, nil)

	_, err := interceptor.New(nil, interceptor.Options{})
	require.ErrorIs(t, err, interceptor.ErrInvalidOptions)

	for name, cfg := range map[string]interceptor.Options{
		"negative ttl":        {LeaseTTL: -1},
		"negative margin":     {Margin: -1},
		"negative max args":   {MaxArgs: -1},
		"negative max result": {MaxResult: -1},
		"ttl within margin":   {LeaseTTL: testMargin, Margin: testMargin},
		"op ttl within margin": {Operations: map[string]interceptor.Operation{
			"op": {LeaseTTL: 10 * time.Millisecond}, // below the 50ms default margin
		}},
		"empty op name": {Operations: map[string]interceptor.Operation{"": {}}},
	} {
		_, err := interceptor.New(l, cfg)
		require.ErrorIs(t, err, interceptor.ErrInvalidOptions, name)
	}

	ic, err := interceptor.New(l, interceptor.Options{})
	require.NoError(t, err)
	require.Equal(t, interceptor.DefaultNamespace, ic.Namespace())
	require.NotEmpty(t, ic.Holder())
	require.Same(t, l, ic.Ledger())
	other, err := interceptor.New(l, interceptor.Options{})
	require.NoError(t, err)
	require.NotEqual(t, ic.Holder(), other.Holder(), "default holders are unique per interceptor")

	require.ErrorIs(t, ic.Register("", interceptor.Operation{}), interceptor.ErrInvalidOptions)
	require.ErrorIs(t, ic.Register("op", interceptor.Operation{LeaseTTL: testMargin}), interceptor.ErrInvalidOptions)
	require.NoError(t, ic.Register("op", interceptor.Operation{UpstreamIdempotent: true}))

	// Keys: tf1_ + 64 hex, namespace-scoped.
	k := ic.Key("t", "op", "x")
	require.NoError(t, residual.ValidKey(k))
	require.Equal(t, residual.Key(interceptor.DefaultNamespace, "t", "op", "x"), k)
	ns, err := interceptor.New(l, interceptor.Options{Namespace: "tenant-2"})
	require.NoError(t, err)
	require.NotEqual(t, k, ns.Key("t", "op", "x"))
}

// WithTask and TaskFrom carry the task; an empty one is not a task.
func TestTaskContext(t *testing.T) {
	t.Parallel()
	_, ok := interceptor.TaskFrom(context.Background())
	require.False(t, ok)
	_, ok = interceptor.TaskFrom(interceptor.WithTask(context.Background(), ""))
	require.False(t, ok)
	task, ok := interceptor.TaskFrom(interceptor.WithTask(context.Background(), "run-1"))
	require.True(t, ok)
	require.Equal(t, "run-1", task)
}

// A caller that gives up between the reservation and the dispatch sends nothing: the tool is
// not run into a dead context, and the attempt is recorded failed (never dispatched), not
// unknown, so the key is not blocked for reconciliation over a call that never left. The
// same holds when, in addition, the margin check fails: the not-dispatched record must still
// be written although the caller's context has ended.
func TestDoCancelledBeforeDispatchIsNotDispatched(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		marginTooSm bool
	}{
		{"cancelled after reserve", false},
		{"cancelled after reserve, margin too small", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fl := &flakyLedger{}
			f := setup(t, withLedger(func(l ledger.Ledger) ledger.Ledger { fl.Ledger = l; return fl }))
			key := f.key("payments.charge", "invoice:INV-42")
			ctx, cancel := context.WithCancel(f.ctx)
			fl.afterReserve = func() {
				if c.marginTooSm {
					f.clock.Advance(testTTL - testMargin/2)
				}
				cancel()
			}
			tl := newTool(func(ctx context.Context, _ interceptor.Dispatch) (interceptor.Response, error) {
				// A well-behaved tool checks its context before sending anything.
				if err := ctx.Err(); err != nil {
					return interceptor.Response{}, err
				}
				return ok(`{"charge":"ch_1"}`), nil
			})
			res, err := f.ic.Do(ctx, charge(chargeArgs), tl.fn)
			require.Nil(t, res)
			require.Error(t, err)
			require.Zero(t, tl.count(), "nothing may be dispatched into a context that already ended")
			require.Equal(t, residual.Failed, f.get(key).State, "a never-dispatched attempt is failed, not unknown")
			if !c.marginTooSm {
				require.ErrorIs(t, err, context.Canceled, "the caller learns why nothing was sent")
			}

			fl.afterReserve = nil
			res, err = f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
			require.NoError(t, err)
			require.Equal(t, 2, res.Attempt)
		})
	}
}

// DispatchFrom finds what WithDispatch put in the context, and nothing outside a guarded call.
func TestDispatchFrom(t *testing.T) {
	t.Parallel()
	_, ok := interceptor.DispatchFrom(t.Context())
	require.False(t, ok)
	want := interceptor.Dispatch{Key: "k", Token: 3, Attempt: 2}
	got, ok := interceptor.DispatchFrom(interceptor.WithDispatch(t.Context(), want))
	require.True(t, ok)
	require.Equal(t, want, got)
}
