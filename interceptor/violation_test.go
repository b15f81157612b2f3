package interceptor_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// While a call is in flight, the same key gets InProgress (for its own holder and a
// successor alike) with RetryAfter = the time left on the lease; the tool is not run again.
func TestViolationInProgress(t *testing.T) {
	t.Parallel()
	f := setup(t)
	key := f.key("payments.charge", "invoice:INV-42")
	started, release := make(chan struct{}), make(chan struct{})
	tl := newTool(func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
		close(started)
		<-release
		return ok(`{"charge":"ch_1"}`), nil
	})
	first, _ := goDo(f.ctx, f.ic, charge(chargeArgs), tl.fn)
	<-started

	other := answering(ok(`{"charge":"ch_dup"}`), nil)
	for _, ic := range []*interceptor.Interceptor{f.ic, f.successor()} {
		res, err := ic.Do(f.ctx, charge(chargeArgs), other.fn)
		require.Nil(t, res)
		v := requireViolation(t, err, interceptor.InProgress, key)
		require.Equal(t, residual.Pending, v.State)
		require.Equal(t, testTTL, v.RetryAfter, "retry-after is the lease expiry (no time has passed)")
		require.Equal(t, holderA, v.Holder)
		require.Equal(t, 1, v.Attempt)
		require.Equal(t, uint64(1), v.Token)
		require.Equal(t, epoch, v.Since.UTC())
		require.Equal(t, testTask, v.Task)
		require.Equal(t, "payments.charge", v.Operation)
		require.Equal(t, "invoice:INV-42", v.Target)
	}
	// Other args while in flight are also InProgress (the payload is judged once settled).
	_, err := f.successor().Do(f.ctx, charge(`{"amount":1}`), other.fn)
	requireViolation(t, err, interceptor.InProgress, key)
	require.Zero(t, other.count())
	require.Equal(t, residual.Pending, f.get(key).State)

	close(release)
	o := <-first
	require.NoError(t, o.err)
	require.False(t, o.res.Replayed)
	res, err := f.successor().Do(f.ctx, charge(chargeArgs), other.fn)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, []byte(`{"charge":"ch_1"}`), res.Output)
	require.Zero(t, other.count())
	require.Equal(t, 1, tl.count())
}

// An error without a definite no-effect marker is an unknown outcome; the key then blocks
// every caller with UnknownOutcome and the tool is not run again.
func TestViolationUnknownOutcomeOnToolError(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		resp interceptor.Response
		err  error
	}{
		{"plain error", interceptor.Response{}, errors.New("read tcp 10.0.0.1:443: i/o timeout")},
		{"deadline", interceptor.Response{}, context.DeadlineExceeded},
		{"wrapped EOF", interceptor.Response{}, fmt.Errorf("post /charges: %w", io.ErrUnexpectedEOF)},
		{"error with a 200", ok(`{"charge":"ch_1"}`), errors.New("decoding the response failed")},
		{"error claiming success", interceptor.Response{Status: 200, Outcome: residual.Succeeded}, errors.New("broken pipe")},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			key := f.key("payments.charge", "invoice:INV-42")
			tl := answering(c.resp, c.err)
			res, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
			v := requireViolation(t, err, interceptor.UnknownOutcome, key)
			require.Equal(t, residual.Unknown, res.State, "the recorded outcome comes with its violation")
			require.ErrorIs(t, err, c.err, "the tool's error is kept as the cause")
			require.Equal(t, residual.Unknown, v.State)
			require.Equal(t, 1, v.Attempt)
			require.Equal(t, holderA, v.Holder)
			require.Equal(t, uint64(1), v.Token)

			r := f.get(key)
			require.Equal(t, residual.Unknown, r.State)
			require.Equal(t, residual.Unknown, r.Attempts[0].Outcome)
			require.Contains(t, r.Attempts[0].Error, c.err.Error())

			for _, ic := range []*interceptor.Interceptor{f.ic, f.successor()} {
				_, err = ic.Do(f.ctx, charge(chargeArgs), tl.fn)
				v = requireViolation(t, err, interceptor.UnknownOutcome, key)
				require.Equal(t, 1, v.Attempt, "the violation names the prior attempt")
				require.Equal(t, holderA, v.Holder)
			}
			require.Equal(t, 1, tl.count(), "an unknown outcome must block: no second dispatch")
		})
	}
}

// A tool that panics has an unknown outcome; the panic never escapes Do.
func TestViolationUnknownOutcomeOnPanic(t *testing.T) {
	t.Parallel()
	f := setup(t)
	key := f.key("payments.charge", "invoice:INV-42")
	tl := newTool(func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
		panic("assignment to entry in nil map")
	})
	var (
		res *interceptor.Result
		err error
	)
	require.NotPanics(t, func() { res, err = f.ic.Do(f.ctx, charge(chargeArgs), tl.fn) })
	requireViolation(t, err, interceptor.UnknownOutcome, key)
	require.Equal(t, residual.Unknown, res.State)
	require.ErrorIs(t, err, interceptor.ErrToolPanicked)
	require.Contains(t, err.Error(), "assignment to entry in nil map")
	require.Equal(t, residual.Unknown, f.get(key).State)

	require.NotPanics(t, func() { _, err = f.ic.Do(f.ctx, charge(chargeArgs), tl.fn) })
	requireViolation(t, err, interceptor.UnknownOutcome, key)
	require.Equal(t, 1, tl.count())
}

// 202, a queued body and any claim of success for a queued answer are recorded as accepted,
// never as succeeded; the next call gets AwaitingUpstream with the handle to poll.
func TestViolationAwaitingUpstream(t *testing.T) {
	t.Parallel()
	claimsSuccess := func(interceptor.Response, error) residual.State { return residual.Succeeded }
	for _, c := range []struct {
		name     string
		resp     interceptor.Response
		classify interceptor.Classifier
	}{
		{"202", interceptor.Response{Status: 202, Handle: "job-1"}, nil},
		{"queued body", interceptor.Response{Status: 200, Body: []byte(`{"status":"queued"}`), Handle: "job-2"}, nil},
		{"tool claims success for a 202", interceptor.Response{Status: 202, Outcome: residual.Succeeded, Handle: "job-3"}, nil},
		{"tool claims success for a queued body", interceptor.Response{Status: 200, Body: []byte(`{"state":"Processing"}`), Outcome: residual.Succeeded, Handle: "job-4"}, nil},
		{"classifier claims success for a 202", interceptor.Response{Status: 202, Handle: "job-5"}, claimsSuccess},
		{"classifier claims success for a queued body", interceptor.Response{Status: 200, Body: []byte(`{"status":"accepted"}`), Handle: "job-6"}, claimsSuccess},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, withConfig(func(cfg *interceptor.Options) {
				cfg.Operations = map[string]interceptor.Operation{"payments.charge": {Classify: c.classify}}
			}))
			key := f.key("payments.charge", "invoice:INV-42")
			tl := answering(c.resp, nil)

			res, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
			v := requireViolation(t, err, interceptor.AwaitingUpstream, key)
			require.Equal(t, residual.Accepted, res.State, "an accepted call is not a success: its violation says what is due")
			require.Equal(t, c.resp.Handle, res.Handle)
			require.Equal(t, c.resp.Handle, v.Handle)
			require.Equal(t, residual.Accepted, v.State)

			r := f.get(key)
			require.Equal(t, residual.Accepted, r.State, "recorded as accepted, never succeeded")
			require.Equal(t, residual.Accepted, r.Attempts[0].Outcome)
			require.Equal(t, c.resp.Handle, r.Handle)

			_, err = f.successor().Do(f.ctx, charge(chargeArgs), tl.fn)
			v = requireViolation(t, err, interceptor.AwaitingUpstream, key)
			require.Equal(t, c.resp.Handle, v.Handle, "the successor gets the handle to poll")
			require.Equal(t, holderA, v.Holder)
			require.Equal(t, 1, tl.count())
		})
	}
}

// The tool outlives its lease (the clock passes the expiry during the call): the commit is
// refused, what the tool saw is appended as evidence, nothing authoritative is written, and
// the caller gets LeaseLost with the tool's result.
func TestViolationLeaseLostByExpiry(t *testing.T) {
	t.Parallel()
	f := setup(t)
	key := f.key("payments.charge", "invoice:INV-42")
	body := []byte(`{"charge":"ch_1"}`)
	tl := newTool(func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
		f.clock.Advance(testTTL + time.Second)
		return interceptor.Response{Status: 200, Body: body}, nil
	})
	res, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.Nil(t, res)
	v := requireViolation(t, err, interceptor.LeaseLost, key)
	require.Equal(t, body, v.Result, "the caller learns what its tool returned")
	require.Equal(t, 1, v.Attempt)
	require.Equal(t, uint64(1), v.Token)
	require.Equal(t, holderA, v.Holder)

	r := f.get(key)
	require.Equal(t, residual.Unknown, r.State, "an expired, uncommitted attempt reads unknown")
	require.Nil(t, r.Result, "nothing authoritative was written")
	require.Equal(t, residual.None, r.Attempts[0].Outcome)
	require.Len(t, r.Evidence, 1)
	ev := r.Evidence[0]
	require.Equal(t, holderA, ev.Holder)
	require.Equal(t, uint64(1), ev.Token)
	require.Equal(t, residual.Succeeded, ev.Outcome)
	require.Equal(t, body, ev.Result)
	require.Equal(t, sha(body), ev.ResponseDigest)

	_, err = f.successor().Do(f.ctx, charge(chargeArgs), tl.fn)
	requireViolation(t, err, interceptor.UnknownOutcome, key)
	require.Equal(t, 1, tl.count())
}

// A successor resolves the key (after the lease expired) while the tool still runs: the
// zombie's commit is refused and kept as evidence; the resolution stands.
func TestViolationLeaseLostByResolve(t *testing.T) {
	t.Parallel()
	f := setup(t)
	key := f.key("payments.charge", "invoice:INV-42")
	var resolveErr error
	tl := newTool(func(_ context.Context, d interceptor.Dispatch) (interceptor.Response, error) {
		f.clock.Advance(testTTL + time.Second)
		_, resolveErr = f.store.Resolve(context.Background(), ledger.ResolveParams{
			Namespace: f.ic.Namespace(), Key: d.Key, As: residual.Failed, By: "operator",
			Note: "upstream has no charge",
		})
		return ok(`{"charge":"ch_late"}`), nil
	})
	_, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.NoError(t, resolveErr)
	v := requireViolation(t, err, interceptor.LeaseLost, key)
	require.Equal(t, []byte(`{"charge":"ch_late"}`), v.Result)

	r := f.get(key)
	require.Equal(t, residual.Failed, r.State, "the resolution stands")
	require.Equal(t, uint64(2), r.Token, "the resolution took a new token")
	require.Len(t, r.Resolutions, 1)
	require.Equal(t, "operator", r.Resolutions[0].By)
	require.Len(t, r.Evidence, 1)
	require.Equal(t, uint64(1), r.Evidence[0].Token)
	require.Equal(t, residual.Succeeded, r.Evidence[0].Outcome)

	// Failed may be retried: a new attempt under a token above the resolution's.
	next := answering(ok(`{"charge":"ch_2"}`), nil)
	res, err := f.ic.Do(f.ctx, charge(chargeArgs), next.fn)
	require.NoError(t, err)
	require.Equal(t, 2, res.Attempt)
	require.Equal(t, uint64(3), res.Token)
}

// For an upstream-idempotent operation a successor re-dispatches once the lease expired;
// the zombie's late commit under the old token is refused and the successor's result stands.
func TestViolationLeaseLostBySuccessorRedispatch(t *testing.T) {
	t.Parallel()
	idem := func(c *interceptor.Options) {
		c.Operations = map[string]interceptor.Operation{"payments.charge": {UpstreamIdempotent: true}}
	}
	f := setup(t, withConfig(idem))
	b := f.successor(idem)
	key := f.key("payments.charge", "invoice:INV-42")
	var (
		bRes *interceptor.Result
		bErr error
	)
	bTool := answering(ok(`{"charge":"ch_1","by":"b"}`), nil)
	aTool := newTool(func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
		f.clock.Advance(testTTL + time.Second)
		bRes, bErr = b.Do(f.ctx, charge(chargeArgs), bTool.fn)
		return ok(`{"charge":"ch_1","by":"a"}`), nil
	})
	_, err := f.ic.Do(f.ctx, charge(chargeArgs), aTool.fn)
	require.NoError(t, bErr)
	require.Equal(t, 2, bRes.Attempt)
	require.Equal(t, uint64(2), bRes.Token)
	v := requireViolation(t, err, interceptor.LeaseLost, key)
	require.Equal(t, uint64(1), v.Token)

	r := f.get(key)
	require.Equal(t, residual.Succeeded, r.State)
	require.Equal(t, []byte(`{"charge":"ch_1","by":"b"}`), r.Result)
	require.Len(t, r.Evidence, 1)
	require.Equal(t, holderA, r.Evidence[0].Holder)
	require.Equal(t, bTool.dispatches()[0].Key, aTool.dispatches()[0].Key, "same upstream key")
}

// skewClock is a process clock that can jump ahead of the ledger's clock.
type skewClock struct {
	*lease.Fake
	skew atomic.Int64
}

func (c *skewClock) Now() time.Time { return c.Fake.Now().Add(time.Duration(c.skew.Load())) }

// When less than the margin is left at dispatch (the clock jumped while the reservation was
// being written), nothing is dispatched: MarginTooSmall, the attempt is recorded failed,
// and the next call runs a new attempt.
func TestViolationMarginTooSmall(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		left       time.Duration
		onlyLocal  bool // only the process clock jumps; the ledger's clock stays
		dispatched bool
	}{
		{"half the margin left", testMargin / 2, false, false},
		{"exactly the margin left", testMargin, false, false},
		{"process clock jumps", testMargin / 2, true, false},
		{"just over the margin", testMargin + time.Millisecond, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fl := &flakyLedger{}
			clock := &skewClock{Fake: lease.NewFake(epoch)}
			jump := testTTL - c.left
			var armed atomic.Bool
			armed.Store(true)
			fl.afterReserve = func() {
				if !armed.Swap(false) {
					return
				}
				if c.onlyLocal {
					clock.skew.Store(int64(jump))
				} else {
					clock.Fake.Advance(jump)
				}
			}
			fl.Ledger = openBadger(t, clock.Fake)
			ic, err := interceptor.New(fl, interceptor.Options{
				Holder: holderA, LeaseTTL: testTTL, Margin: testMargin, Clock: clock,
			})
			require.NoError(t, err)
			ctx := interceptor.WithTask(t.Context(), testTask)
			key := ic.Key(testTask, "payments.charge", "invoice:INV-42")
			tl := answering(ok(`{"charge":"ch_1"}`), nil)

			res, err := ic.Do(ctx, charge(chargeArgs), tl.fn)
			if c.dispatched {
				require.NoError(t, err)
				require.Equal(t, 1, tl.count())
				require.False(t, res.Replayed)
				return
			}
			require.Nil(t, res)
			v := requireViolation(t, err, interceptor.MarginTooSmall, key)
			require.Zero(t, tl.count(), "nothing may be dispatched with less than the margin left")
			require.Equal(t, 1, v.Attempt)
			require.Equal(t, uint64(1), v.Token)
			require.Equal(t, holderA, v.Holder)

			r, err := fl.Ledger.Get(context.Background(), ledger.GetParams{Namespace: ic.Namespace(), Key: key})
			require.NoError(t, err)
			require.Equal(t, residual.Failed, r.State, "a not-dispatched attempt is failed")
			require.Equal(t, residual.Failed, r.Attempts[0].Outcome)
			require.Contains(t, r.Attempts[0].Error, "not dispatched")

			clock.skew.Store(0)
			res, err = ic.Do(ctx, charge(chargeArgs), tl.fn)
			require.NoError(t, err)
			require.Equal(t, 2, res.Attempt)
			require.Equal(t, uint64(2), res.Token)
			require.Equal(t, 1, tl.count())
		})
	}
}

// Violation.Error names the kind, the key, the prior attempt and the recovery; Unwrap
// exposes both the sentinel and the cause.
func TestViolationErrorAndUnwrap(t *testing.T) {
	t.Parallel()
	cause := errors.New("upstream timed out")
	v := &interceptor.Violation{
		Kind: interceptor.UnknownOutcome, Key: residual.Key("ns", "t", "op", "x"), Operation: "op",
		Target: "x", Attempt: 2, Holder: "agent-a", Token: 7, Since: epoch,
		Recovery: "reconcile first", Cause: cause,
	}
	msg := v.Error()
	for _, want := range []string{"unknown_outcome", v.Key, "attempt 2", "agent-a", "token 7", "upstream timed out", "reconcile first"} {
		require.Contains(t, msg, want)
	}
	require.ErrorIs(t, v, residual.ErrUnknownOutcome)
	require.ErrorIs(t, v, cause)
	require.NotErrorIs(t, v, residual.ErrInProgress)
	for kind, s := range sentinels {
		require.Equal(t, s, kind.Sentinel(), "kind %s", kind)
	}
}

// The commit, too, needs more than the margin left on the lease (measured at the ledger):
// a tool that returns with less left is fenced out, its outcome kept as evidence only.
// Renewal is disabled so nothing extends the lease behind the test's back.
func TestViolationCommitNeedsMargin(t *testing.T) {
	t.Parallel()
	fl := &flakyLedger{}
	f := setup(t,
		withConfig(func(c *interceptor.Options) { c.RenewEvery = -1 }),
		withLedger(func(l ledger.Ledger) ledger.Ledger { fl.Ledger = l; return fl }))
	key := f.key("payments.charge", "invoice:INV-42")
	tl := newTool(func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
		f.clock.Advance(testTTL - testMargin/2) // the lease has not expired, but is inside the margin
		return ok(`{"charge":"ch_1"}`), nil
	})
	res, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.Nil(t, res)
	v := requireViolation(t, err, interceptor.LeaseLost, key)
	require.Equal(t, []byte(`{"charge":"ch_1"}`), v.Result)
	require.Zero(t, fl.renews.Load(), "renewal was disabled")

	r := f.get(key)
	require.Equal(t, residual.Pending, r.State, "nothing authoritative was written; the lease runs out")
	require.Len(t, r.Evidence, 1)
	require.Equal(t, residual.Succeeded, r.Evidence[0].Outcome)
	f.clock.Advance(testMargin)
	require.Equal(t, residual.Unknown, f.get(key).State)
}
