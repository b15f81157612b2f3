package interceptor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// leaveUnknown makes a call whose tool errs ambiguously, leaving an unknown residual, and
// returns its key.
func leaveUnknown(t *testing.T, f *fixture, call interceptor.Call) string {
	t.Helper()
	tl := answering(interceptor.Response{}, errors.New("connection reset by peer"))
	_, err := f.ic.Do(f.ctx, call, tl.fn)
	key := f.key(call.Operation, call.Target)
	requireViolation(t, err, interceptor.UnknownOutcome, key)
	return key
}

// A probe that finds the effect upstream settles the residual as succeeded under a new,
// higher token; the next call replays the probe's result without dispatching.
func TestReconcileProbeSucceeded(t *testing.T) {
	t.Parallel()
	var probed *residual.Residual
	probe := func(_ context.Context, r *residual.Residual) (interceptor.ProbeResult, error) {
		probed = r
		return interceptor.ProbeResult{
			Outcome: residual.Succeeded, Result: []byte(`{"charge":"ch_1"}`),
			Evidence: "GET /charges?idempotency_key=" + r.Key + " → ch_1",
		}, nil
	}
	f := setup(t, withConfig(func(c *interceptor.Options) {
		c.Operations = map[string]interceptor.Operation{"payments.charge": {Probe: probe}}
	}))
	key := leaveUnknown(t, f, charge(chargeArgs))

	rep, err := f.ic.Reconcile(f.ctx, interceptor.ReconcileParams{})
	require.NoError(t, err)
	require.Empty(t, rep.Unsettled)
	require.Len(t, rep.Settled, 1)
	s := rep.Settled[0]
	require.Equal(t, key, s.Key)
	require.Equal(t, residual.Unknown, s.From)
	require.Equal(t, residual.Succeeded, s.To)
	require.Greater(t, s.Token, uint64(1), "a resolution takes a new, higher token")
	require.Contains(t, s.Evidence, "ch_1")
	require.Equal(t, key, probed.Key, "the probe is asked about the key it can look up upstream")

	r := f.get(key)
	require.Equal(t, residual.Succeeded, r.State)
	require.Equal(t, s.Token, r.Token)
	require.Len(t, r.Resolutions, 1)
	res0 := r.Resolutions[0]
	require.Equal(t, "reconciler:"+holderA, res0.By, "the audit names the reconciler")
	require.Equal(t, residual.Unknown, res0.From)
	require.Equal(t, residual.Succeeded, res0.To)
	require.Contains(t, res0.Evidence, "ch_1")

	tl := answering(ok(`{"charge":"ch_dup"}`), nil)
	res, err := f.successor().Do(f.ctx, charge(chargeArgs), tl.fn)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, []byte(`{"charge":"ch_1"}`), res.Output)
	require.Zero(t, tl.count())

	// A settled key is left alone by the next pass.
	rep, err = f.ic.Reconcile(f.ctx, interceptor.ReconcileParams{})
	require.NoError(t, err)
	require.Empty(t, rep.Settled)
	require.Empty(t, rep.Unsettled)
}

// A probe that finds no effect settles the residual as failed; the next call is a new
// attempt under a token above the resolution's.
func TestReconcileProbeFailed(t *testing.T) {
	t.Parallel()
	probe := func(context.Context, *residual.Residual) (interceptor.ProbeResult, error) {
		return interceptor.ProbeResult{Outcome: residual.Failed, Evidence: "no such charge"}, nil
	}
	f := setup(t, withConfig(func(c *interceptor.Options) {
		c.Operations = map[string]interceptor.Operation{"payments.charge": {Probe: probe}}
	}))
	key := leaveUnknown(t, f, charge(chargeArgs))
	rep, err := f.ic.Reconcile(f.ctx, interceptor.ReconcileParams{Key: key, By: "ops@example.com"})
	require.NoError(t, err)
	require.Len(t, rep.Settled, 1)
	require.Equal(t, residual.Failed, rep.Settled[0].To)
	require.Equal(t, "ops@example.com", f.get(key).Resolutions[0].By)

	tl := answering(ok(`{"charge":"ch_2"}`), nil)
	res, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 2, res.Attempt)
	require.Greater(t, res.Token, rep.Settled[0].Token)
}

// Probes that do not know (accepted, unknown), fail or panic leave the residual open with
// the reason; without a probe the residual is listed as needing a person.
func TestReconcileLeavesOpen(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		probe  interceptor.Probe
		reason string
	}{
		{"probe says accepted", func(context.Context, *residual.Residual) (interceptor.ProbeResult, error) {
			return interceptor.ProbeResult{Outcome: residual.Accepted, Evidence: "job still running"}, nil
		}, "accepted"},
		{"probe says unknown", func(context.Context, *residual.Residual) (interceptor.ProbeResult, error) {
			return interceptor.ProbeResult{Outcome: residual.Unknown, Evidence: "upstream has no lookup"}, nil
		}, "unknown"},
		{"probe says pending", func(context.Context, *residual.Residual) (interceptor.ProbeResult, error) {
			return interceptor.ProbeResult{Outcome: residual.Pending}, nil
		}, "pending"},
		{"probe errs", func(context.Context, *residual.Residual) (interceptor.ProbeResult, error) {
			return interceptor.ProbeResult{Outcome: residual.Succeeded}, errors.New("status API down")
		}, "status API down"},
		{"probe panics", func(context.Context, *residual.Residual) (interceptor.ProbeResult, error) {
			panic("probe bug")
		}, "probe bug"},
		{"no probe", nil, "no probe registered"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, withConfig(func(cfg *interceptor.Options) {
				cfg.Operations = map[string]interceptor.Operation{"payments.charge": {Probe: c.probe}}
			}))
			key := leaveUnknown(t, f, charge(chargeArgs))
			var (
				rep *interceptor.ReconcileReport
				err error
			)
			require.NotPanics(t, func() { rep, err = f.ic.Reconcile(f.ctx, interceptor.ReconcileParams{}) })
			require.NoError(t, err, "probe trouble is reported per residual, not as an error")
			require.Empty(t, rep.Settled)
			require.Len(t, rep.Unsettled, 1)
			require.Equal(t, key, rep.Unsettled[0].Key)
			require.Equal(t, residual.Unknown, rep.Unsettled[0].State)
			require.Contains(t, rep.Unsettled[0].Reason, c.reason)

			r := f.get(key)
			require.Equal(t, residual.Unknown, r.State, "an open residual is left as it was")
			require.Equal(t, uint64(1), r.Token)
			require.Empty(t, r.Resolutions)
		})
	}
}

// An accepted residual is settled by a probe that polls the upstream handle.
func TestReconcileAcceptedByHandle(t *testing.T) {
	t.Parallel()
	probe := func(_ context.Context, r *residual.Residual) (interceptor.ProbeResult, error) {
		if r.Handle != "job-1" {
			return interceptor.ProbeResult{}, errors.New("unknown handle " + r.Handle)
		}
		return interceptor.ProbeResult{Outcome: residual.Succeeded, Result: []byte(`{"status":"done"}`), Evidence: "job-1 done"}, nil
	}
	f := setup(t, withConfig(func(c *interceptor.Options) {
		c.Operations = map[string]interceptor.Operation{"export.start": {Probe: probe}}
	}))
	call := interceptor.Call{Operation: "export.start", Target: "report:q3"}
	tl := answering(interceptor.Response{Status: 202, Handle: "job-1"}, nil)
	_, err := f.ic.Do(f.ctx, call, tl.fn)
	key := f.key(call.Operation, call.Target)
	requireViolation(t, err, interceptor.AwaitingUpstream, key)

	rep, err := f.ic.Reconcile(f.ctx, interceptor.ReconcileParams{Operation: "export.start"})
	require.NoError(t, err)
	require.Len(t, rep.Settled, 1)
	require.Equal(t, residual.Accepted, rep.Settled[0].From)
	require.Equal(t, residual.Succeeded, rep.Settled[0].To)

	res, err := f.ic.Do(f.ctx, call, tl.fn)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, []byte(`{"status":"done"}`), res.Output)
	require.Equal(t, 1, tl.count())
}

// Reconcile leaves a live pending residual alone, probes a crashed holder's expired one,
// and filters by task, operation and key.
func TestReconcileSelection(t *testing.T) {
	t.Parallel()
	probes := 0
	probe := func(context.Context, *residual.Residual) (interceptor.ProbeResult, error) {
		probes++
		return interceptor.ProbeResult{Outcome: residual.Failed, Evidence: "nothing upstream"}, nil
	}
	f := setup(t, withConfig(func(c *interceptor.Options) {
		c.Operations = map[string]interceptor.Operation{
			"payments.charge": {Probe: probe}, "email.send": {Probe: probe},
		}
	}))
	chargeKey := leaveUnknown(t, f, charge(chargeArgs))
	emailKey := leaveUnknown(t, f, interceptor.Call{Operation: "email.send", Target: "email:bob@example.com"})
	otherTask := interceptor.WithTask(context.Background(), "run-99")
	_, err := f.ic.Do(otherTask, charge(chargeArgs), answering(interceptor.Response{}, errors.New("reset")).fn)
	require.Error(t, err)

	// A call in flight: never probed.
	started, release := make(chan struct{}), make(chan struct{})
	blocked := newTool(func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
		close(started)
		<-release
		return ok(`{}`), nil
	})
	inflight := interceptor.Call{Operation: "payments.charge", Target: "invoice:INV-77"}
	done, _ := goDo(f.ctx, f.ic, inflight, blocked.fn)
	<-started

	rep, err := f.ic.Reconcile(f.ctx, interceptor.ReconcileParams{Key: emailKey})
	require.NoError(t, err)
	require.Len(t, rep.Settled, 1)
	require.Equal(t, emailKey, rep.Settled[0].Key)
	require.Equal(t, 1, probes)

	rep, err = f.ic.Reconcile(f.ctx, interceptor.ReconcileParams{Task: testTask, Operation: "payments.charge"})
	require.NoError(t, err)
	require.Len(t, rep.Settled, 1)
	require.Equal(t, chargeKey, rep.Settled[0].Key)
	require.Len(t, rep.Unsettled, 1, "the call in flight is listed, not probed")
	require.Equal(t, f.key(inflight.Operation, inflight.Target), rep.Unsettled[0].Key)
	require.Equal(t, residual.Pending, rep.Unsettled[0].State)
	require.Equal(t, 2, probes)

	close(release)
	require.NoError(t, (<-done).err)

	rep, err = f.ic.Reconcile(f.ctx, interceptor.ReconcileParams{})
	require.NoError(t, err)
	require.Len(t, rep.Settled, 1, "only run-99's residual is left")
	require.Equal(t, f.ic.Key("run-99", "payments.charge", "invoice:INV-42"), rep.Settled[0].Key)

	_, err = f.ic.Reconcile(f.ctx, interceptor.ReconcileParams{Key: f.key("nope", "nothing")})
	require.ErrorIs(t, err, residual.ErrNotFound)
}

// A zombie holder (its lease expired mid-call) is fenced out by a reconciliation: its late
// commit is refused with LeaseLost, kept as evidence, and the resolution stands.
func TestReconcileFencesOutZombie(t *testing.T) {
	t.Parallel()
	probe := func(context.Context, *residual.Residual) (interceptor.ProbeResult, error) {
		return interceptor.ProbeResult{Outcome: residual.Succeeded, Result: []byte(`{"charge":"ch_1"}`), Evidence: "found ch_1"}, nil
	}
	withProbe := func(c *interceptor.Options) {
		c.Operations = map[string]interceptor.Operation{"payments.charge": {Probe: probe}}
	}
	f := setup(t, withConfig(withProbe))
	reconciler := f.successor(withProbe)
	key := f.key("payments.charge", "invoice:INV-42")
	var (
		rep    *interceptor.ReconcileReport
		repErr error
	)
	zombie := newTool(func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
		f.clock.Advance(testTTL + time.Second) // the holder stalls past its lease
		rep, repErr = reconciler.Reconcile(context.Background(), interceptor.ReconcileParams{})
		return ok(`{"charge":"ch_1","late":true}`), nil
	})
	_, err := f.ic.Do(f.ctx, charge(chargeArgs), zombie.fn)
	require.NoError(t, repErr)
	require.Len(t, rep.Settled, 1)
	require.Equal(t, residual.Unknown, rep.Settled[0].From, "an expired pending reads unknown")
	v := requireViolation(t, err, interceptor.LeaseLost, key)
	require.Equal(t, uint64(1), v.Token)

	r := f.get(key)
	require.Equal(t, residual.Succeeded, r.State)
	require.Equal(t, []byte(`{"charge":"ch_1"}`), r.Result, "the resolution's result stands")
	require.Equal(t, rep.Settled[0].Token, r.Token)
	require.Len(t, r.Evidence, 1)
	require.Equal(t, holderA, r.Evidence[0].Holder)
	require.Equal(t, uint64(1), r.Evidence[0].Token)
	require.Equal(t, []byte(`{"charge":"ch_1","late":true}`), r.Evidence[0].Result)
}

// A probe's answer is about the attempt it looked at. When a later attempt begins while the
// probe runs (and may have had the effect), the probe's "not found" must not settle the key
// as failed: the resolve is conditional on the probed attempt's token, so it is refused and
// the key stays open, with its later attempt, for the next pass.
func TestReconcileProbeAnswerNeverSettlesALaterAttempt(t *testing.T) {
	t.Parallel()
	var f *fixture
	var second *ledger.ReserveResult
	probe := func(ctx context.Context, r *residual.Residual) (interceptor.ProbeResult, error) {
		// Meanwhile another agent re-dispatches the call (attempt 2), whose lease then
		// expires: the key reads unknown again, under attempt 2's token.
		var err error
		second, err = f.store.Reserve(ctx, ledger.ReserveParams{
			Namespace: f.ic.Namespace(), Key: r.Key, Task: r.Task, Operation: r.Operation, Target: r.Target,
			Holder: holderB, RequestDigest: r.RequestDigest, TTL: testTTL, Redispatch: true,
		})
		require.NoError(t, err)
		require.Equal(t, ledger.Acquired, second.Decision)
		f.clock.Advance(2 * testTTL)
		return interceptor.ProbeResult{Outcome: residual.Failed, Evidence: "no charge for attempt 1"}, nil
	}
	f = setup(t, withConfig(func(c *interceptor.Options) {
		c.Operations = map[string]interceptor.Operation{"payments.charge": {Probe: probe}}
	}))
	key := leaveUnknown(t, f, charge(chargeArgs))
	first := f.get(key).Token

	rep, err := f.ic.Reconcile(f.ctx, interceptor.ReconcileParams{})
	require.NoError(t, err)
	require.Empty(t, rep.Settled, "attempt 1's probe answer must not resolve attempt 2")
	require.Len(t, rep.Unsettled, 1)
	require.Contains(t, rep.Unsettled[0].Reason, "token changed")

	r := f.get(key)
	require.Equal(t, residual.Unknown, r.State)
	require.Empty(t, r.Resolutions)
	require.Len(t, r.Attempts, 2)
	require.Equal(t, second.Lease.Token, r.Token)
	require.Greater(t, r.Token, first)

	// The direct API refuses the stale token the same way, and takes the current one.
	_, err = f.ic.Resolve(f.ctx, interceptor.ResolveParams{Key: key, As: residual.Failed, By: "ops", Note: "checked", IfToken: first})
	require.ErrorIs(t, err, residual.ErrTokenChanged)
	got, err := f.ic.Resolve(f.ctx, interceptor.ResolveParams{Key: key, As: residual.Failed, By: "ops", Note: "checked", IfToken: r.Token})
	require.NoError(t, err)
	require.Equal(t, residual.Failed, got.State)
}
