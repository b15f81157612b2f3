package interceptor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// A call that runs for several lease lengths keeps its lease through renewals under its
// token and commits succeeded; the session's goroutine is gone when Do returns.
// Not parallel: it checks for leaked goroutines.
func TestKeepAliveRenewsLongCall(t *testing.T) {
	const ttl = 3 * time.Second
	fl := &flakyLedger{}
	f := setup(t,
		withConfig(func(c *interceptor.Options) { c.LeaseTTL = ttl }),
		withLedger(func(l ledger.Ledger) ledger.Ledger { fl.Ledger = l; return fl }))
	key := f.key("deploy", "service:api")
	before := goleak.IgnoreCurrent()

	tl := newTool(func(ctx context.Context, _ interceptor.Dispatch) (interceptor.Response, error) {
		select {
		case <-f.clock.After(4 * ttl):
			return ok(`{"deployed":true}`), nil
		case <-ctx.Done():
			return interceptor.Response{}, context.Cause(ctx)
		}
	})
	ch, done := goDo(f.ctx, f.ic, interceptor.Call{Operation: "deploy", Target: "service:api"}, tl.fn)
	steps := 0
	// Move time only while both the tool and the keep-alive wait on the clock, so each
	// renewal has landed before time moves on (the same in the tests below).
	for waitUntil(t, done, func() bool { return f.clock.Waiters() >= 2 }) {
		f.clock.Advance(ttl / 12)
		steps++
		require.Less(t, steps, 1000, "the call should have ended")
	}
	o := <-ch
	require.NoError(t, o.err)
	require.Equal(t, residual.Succeeded, o.res.State)
	require.Equal(t, 1, o.res.Attempt)
	require.Equal(t, uint64(1), o.res.Token, "renewals keep the token")
	require.GreaterOrEqual(t, steps, 48, "the call spanned four lease lengths")
	require.GreaterOrEqual(t, int(fl.renews.Load()), 11, "about one renewal per third of the lease")

	r := f.get(key)
	require.Equal(t, residual.Succeeded, r.State)
	require.Len(t, r.Attempts, 1)
	require.True(t, r.Attempts[0].LeaseExpires.After(epoch.Add(4*ttl)), "the lease was extended past the call")
	goleak.VerifyNone(t, before)
}

// When a renewal is refused (the lease was lost), the call's context is cancelled with a
// cause wrapping ErrLeaseLost, and the call ends unknown or preempted, never succeeded.
func TestKeepAliveRefusedRenewalCancelsCall(t *testing.T) {
	t.Parallel()
	fl := &flakyLedger{renewErr: fmt.Errorf("%w: preempted by a test", residual.ErrLeaseLost)}
	f := setup(t, withLedger(func(l ledger.Ledger) ledger.Ledger { fl.Ledger = l; return fl }))
	key := f.key("deploy", "service:api")
	var cause error
	tl := newTool(func(ctx context.Context, _ interceptor.Dispatch) (interceptor.Response, error) {
		select {
		case <-ctx.Done():
		case <-f.clock.After(10 * testTTL): // bounds the test if the context never ends
		}
		cause = context.Cause(ctx)
		return ok(`{"deployed":"maybe"}`), ctx.Err()
	})
	ch, done := goDo(f.ctx, f.ic, interceptor.Call{Operation: "deploy", Target: "service:api"}, tl.fn)
	for waitUntil(t, done, func() bool { return f.clock.Waiters() >= 2 }) {
		f.clock.Advance(testTTL / 6)
	}
	o := <-ch
	require.ErrorIs(t, cause, residual.ErrLeaseLost, "the tool's context ends because the lease was lost")
	require.True(t, o.res == nil || o.res.State == residual.Unknown, "never succeeded")
	var v *interceptor.Violation
	require.ErrorAs(t, o.err, &v)
	require.Contains(t, []interceptor.Kind{interceptor.UnknownOutcome, interceptor.LeaseLost}, v.Kind)
	require.GreaterOrEqual(t, int(fl.renews.Load()), 1)
	f.clock.Advance(testTTL)
	require.Equal(t, residual.Unknown, f.get(key).State)
}

// When renewals keep failing transiently, the call is cut off before its lease expires
// (cause wraps ErrMarginTooSmall), so the tool never acts on an expired lease.
func TestKeepAliveCutsOffBeforeExpiry(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	fl := &flakyLedger{renewErr: errors.New("ledger unavailable")}
	f := setup(t,
		withConfig(func(c *interceptor.Options) { c.LeaseTTL = ttl }),
		withLedger(func(l ledger.Ledger) ledger.Ledger { fl.Ledger = l; return fl }))
	key := f.key("deploy", "service:api")
	var (
		cause error
		at    time.Time
	)
	tl := newTool(func(ctx context.Context, _ interceptor.Dispatch) (interceptor.Response, error) {
		select {
		case <-ctx.Done():
		case <-f.clock.After(10 * ttl): // bounds the test if the context never ends
		}
		cause, at = context.Cause(ctx), f.clock.Now()
		return interceptor.Response{}, ctx.Err()
	})
	ch, done := goDo(f.ctx, f.ic, interceptor.Call{Operation: "deploy", Target: "service:api"}, tl.fn)
	for waitUntil(t, done, func() bool { return f.clock.Waiters() >= 2 }) {
		f.clock.Advance(10 * time.Millisecond)
	}
	o := <-ch
	require.ErrorIs(t, cause, residual.ErrMarginTooSmall)
	require.True(t, at.Before(epoch.Add(ttl)), "cut off at %s, before the lease expired at %s", at, epoch.Add(ttl))
	require.GreaterOrEqual(t, int(fl.renews.Load()), 2, "renewals were tried")
	var v *interceptor.Violation
	require.ErrorAs(t, o.err, &v)
	require.Contains(t, []interceptor.Kind{interceptor.UnknownOutcome, interceptor.LeaseLost}, v.Kind)
	f.clock.Advance(ttl)
	require.Equal(t, residual.Unknown, f.get(key).State)
}

// A result over MaxResult is cached cut at the cap and marked truncated; the digest stays
// that of the full result; the first caller gets the whole result.
func TestResultCap(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		cap       int
		size      int
		truncated bool
	}{
		{"over a custom cap", 16, 40, true},
		{"exactly the cap", 16, 16, false},
		{"over the default 256 KiB", 0, interceptor.DefaultMaxResult + 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, withConfig(func(cfg *interceptor.Options) { cfg.MaxResult = c.cap }))
			limit := cmpOr(c.cap, interceptor.DefaultMaxResult)
			body := bytes.Repeat([]byte("0123456789"), c.size/10+1)[:c.size]
			tl := answering(interceptor.Response{Status: 200, Body: body}, nil)

			first, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
			require.NoError(t, err)
			require.Equal(t, body, first.Output, "the first caller gets the full result")
			require.False(t, first.Truncated)
			require.Equal(t, sha(body), first.ResultDigest)

			again, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
			require.NoError(t, err)
			require.True(t, again.Replayed)
			require.Equal(t, c.truncated, again.Truncated)
			require.Equal(t, sha(body), again.ResultDigest, "the digest is of the full result")
			if c.truncated {
				require.Len(t, again.Output, limit)
				require.Equal(t, body[:limit], again.Output)
			} else {
				require.Equal(t, body, again.Output)
			}
			r := f.get(first.Key)
			require.Equal(t, c.truncated, r.ResultTruncated)
			require.LessOrEqual(t, len(r.Result), limit)
			require.Equal(t, 1, tl.count())
		})
	}
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// The Redact hook rewrites what is cached (the secret is stored nowhere, not even in
// evidence); the first caller gets the full result; the digest is of the full result.
func TestRedact(t *testing.T) {
	t.Parallel()
	secret := []byte("sk_live_4242")
	var ops []string
	var mu sync.Mutex
	redact := func(op string, b []byte) []byte {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
		return bytes.ReplaceAll(b, secret, []byte("[redacted]"))
	}
	f := setup(t, withConfig(func(c *interceptor.Options) { c.Redact = redact }))
	body := []byte(`{"charge":"ch_1","api_key":"sk_live_4242"}`)
	tl := answering(interceptor.Response{Status: 200, Body: body}, nil)

	first, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.NoError(t, err)
	require.Equal(t, body, first.Output, "the first caller gets the full result")
	again, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, `{"charge":"ch_1","api_key":"[redacted]"}`, string(again.Output))
	require.Equal(t, sha(body), again.ResultDigest)
	require.Contains(t, ops, "payments.charge", "Redact gets the operation")
	stored, err := json.Marshal(f.get(first.Key))
	require.NoError(t, err)
	require.NotContains(t, string(stored), string(secret))

	// A fenced-out holder's evidence is redacted too.
	late := newTool(func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
		f.clock.Advance(testTTL + time.Second)
		return interceptor.Response{Status: 200, Body: body}, nil
	})
	call := interceptor.Call{Operation: "payments.charge", Target: "invoice:INV-43"}
	_, err = f.ic.Do(f.ctx, call, late.fn)
	v := requireViolation(t, err, interceptor.LeaseLost, f.key(call.Operation, call.Target))
	require.Equal(t, body, v.Result, "the caller still learns what its tool returned")
	r := f.get(v.Key)
	require.Len(t, r.Evidence, 1)
	stored, err = json.Marshal(r)
	require.NoError(t, err)
	require.NotContains(t, string(stored), string(secret))
}

// An upstream-idempotent operation re-dispatches an unknown attempt under the same key
// (attempt 2, new token) instead of blocking; a normal operation blocks; other args still
// block, since the upstream key would deduplicate a different request.
func TestUpstreamIdempotentRedispatch(t *testing.T) {
	t.Parallel()
	f := setup(t, withConfig(func(c *interceptor.Options) {
		c.Operations = map[string]interceptor.Operation{"webhook.fire": {UpstreamIdempotent: true}}
	}))
	timeout := errors.New("i/o timeout")
	flaky := func() *tool {
		first := true
		return newTool(func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
			if first {
				first = false
				return interceptor.Response{}, timeout
			}
			return ok(`{"delivered":true}`), nil
		})
	}

	idem := interceptor.Call{Operation: "webhook.fire", Target: "hook:orders", Args: json.RawMessage(`{"event":"paid"}`)}
	tl := flaky()
	_, err := f.ic.Do(f.ctx, idem, tl.fn)
	requireViolation(t, err, interceptor.UnknownOutcome, f.key(idem.Operation, idem.Target))

	other := idem
	other.Args = json.RawMessage(`{"event":"refunded"}`)
	_, err = f.ic.Do(f.ctx, other, tl.fn)
	requireViolation(t, err, interceptor.UnknownOutcome, f.key(idem.Operation, idem.Target))
	require.Equal(t, 1, tl.count(), "other args are not re-dispatched")

	res, err := f.ic.Do(f.ctx, idem, tl.fn)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 2, res.Attempt)
	require.Equal(t, uint64(2), res.Token)
	ds := tl.dispatches()
	require.Len(t, ds, 2)
	require.Equal(t, ds[0].Key, ds[1].Key, "re-dispatch under the same upstream idempotency key")
	require.Equal(t, 2, ds[1].Attempt)
	r := f.get(res.Key)
	require.Len(t, r.Attempts, 2)
	require.Equal(t, residual.Unknown, r.Attempts[0].Outcome)
	require.Equal(t, residual.Succeeded, r.Attempts[1].Outcome)

	normal := interceptor.Call{Operation: "email.send", Target: "email:bob@example.com"}
	tl = flaky()
	_, err = f.ic.Do(f.ctx, normal, tl.fn)
	requireViolation(t, err, interceptor.UnknownOutcome, f.key(normal.Operation, normal.Target))
	_, err = f.ic.Do(f.ctx, normal, tl.fn)
	requireViolation(t, err, interceptor.UnknownOutcome, f.key(normal.Operation, normal.Target))
	require.Equal(t, 1, tl.count(), "a normal operation blocks on an unknown outcome")

	// Registering the policy later takes effect for the next call.
	require.NoError(t, f.ic.Register("email.send", interceptor.Operation{UpstreamIdempotent: true}))
	res, err = f.ic.Do(f.ctx, normal, tl.fn)
	require.NoError(t, err)
	require.Equal(t, 2, res.Attempt)
}

// A holder that crashed mid-call leaves a pending residual: while its lease lives everyone
// gets InProgress (upstream-idempotent or not); once it expires, an upstream-idempotent
// operation re-dispatches and a normal one gets UnknownOutcome.
func TestCrashedHolder(t *testing.T) {
	t.Parallel()
	f := setup(t, withConfig(func(c *interceptor.Options) {
		c.Operations = map[string]interceptor.Operation{"webhook.fire": {UpstreamIdempotent: true}}
	}))
	crash := func(call interceptor.Call) string {
		key := f.key(call.Operation, call.Target)
		d, err := residual.Digest(call.Args)
		require.NoError(t, err)
		res, err := f.store.Reserve(context.Background(), ledger.ReserveParams{
			Namespace: f.ic.Namespace(), Key: key, Task: testTask, Operation: call.Operation,
			Target: call.Target, Holder: "dead-agent", RequestDigest: d, TTL: testTTL,
		})
		require.NoError(t, err)
		require.Equal(t, ledger.Acquired, res.Decision)
		return key
	}
	idem := interceptor.Call{Operation: "webhook.fire", Target: "hook:orders", Args: json.RawMessage(`{"event":"paid"}`)}
	normal := interceptor.Call{Operation: "email.send", Target: "email:bob@example.com", Args: json.RawMessage(`{}`)}
	idemKey, normalKey := crash(idem), crash(normal)
	tl := answering(ok(`{}`), nil)

	for _, c := range []interceptor.Call{idem, normal} {
		_, err := f.ic.Do(f.ctx, c, tl.fn)
		v := requireViolation(t, err, interceptor.InProgress, f.key(c.Operation, c.Target))
		require.Equal(t, "dead-agent", v.Holder)
	}
	f.clock.Advance(testTTL)
	res, err := f.ic.Do(f.ctx, idem, tl.fn)
	require.NoError(t, err)
	require.Equal(t, idemKey, res.Key)
	require.Equal(t, 2, res.Attempt)
	_, err = f.ic.Do(f.ctx, normal, tl.fn)
	v := requireViolation(t, err, interceptor.UnknownOutcome, normalKey)
	require.Equal(t, "dead-agent", v.Holder)
	require.Equal(t, 1, tl.count())
}

// 64 goroutines make the same call at once: the tool runs exactly once; every other caller
// gets InProgress or a replay of that one result.
func TestConcurrentSameCallRunsOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b := f.successor()
	key := f.key("payments.charge", "invoice:INV-42")
	tl := answering(ok(`{"charge":"ch_1"}`), nil)
	const n = 64
	start := make(chan struct{})
	results := make([]outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		ic := f.ic
		if i%2 == 1 {
			ic = b
		}
		wg.Go(func() {
			<-start
			res, err := ic.Do(f.ctx, charge(chargeArgs), tl.fn)
			results[i] = outcome{res, err}
		})
	}
	close(start)
	wg.Wait()
	require.Equal(t, 1, tl.count(), "the tool must run exactly once")
	executed := 0
	for _, o := range results {
		if o.err != nil {
			requireViolation(t, o.err, interceptor.InProgress, key)
			continue
		}
		require.Equal(t, []byte(`{"charge":"ch_1"}`), o.res.Output)
		if !o.res.Replayed {
			executed++
		}
	}
	require.Equal(t, 1, executed)
	r := f.get(key)
	require.Equal(t, residual.Succeeded, r.State)
	require.Len(t, r.Attempts, 1)
}

// 64 goroutines with distinct keys all run and commit (group commit must not lose or
// conflate steps).
func TestConcurrentDistinctKeys(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tl := newTool(func(_ context.Context, d interceptor.Dispatch) (interceptor.Response, error) {
		return ok(`{"target":"` + d.Target + `"}`), nil
	})
	const n = 64
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			call := interceptor.Call{Operation: "email.send", Target: fmt.Sprintf("email:%d@example.com", i)}
			res, err := f.ic.Do(f.ctx, call, tl.fn)
			if err == nil && (res.Replayed || res.Token != 1 || !strings.Contains(string(res.Output), call.Target)) {
				err = fmt.Errorf("unexpected result %+v", res)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, n, tl.count())
	rs := f.list()
	require.Len(t, rs, n)
	for _, r := range rs {
		require.Equal(t, residual.Succeeded, r.State)
	}
}
