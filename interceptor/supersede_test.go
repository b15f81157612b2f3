package interceptor_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
)

// TestBeginSupersedeStartsANewIntent: a Begin that supersedes the success a replay showed
// (its Token) gets an *Attempt on the same key, attempt 2 under a higher token; while it is
// pending the key is in progress for every other caller (a crash successor computing the
// same key is blocked); once committed, replays give the new result and the residual keeps
// both attempts.
func TestBeginSupersedeStartsANewIntent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	key := f.key("payments.charge", "invoice:INV-42")
	first, err := f.ic.Do(f.ctx, charge(chargeArgs), answering(ok(`{"id":"ch_1"}`), nil).fn)
	require.NoError(t, err)
	_, replay, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, first.Token, replay.Token)

	a, again, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{Supersede: replay.Token})
	require.NoError(t, err)
	require.Nil(t, again)
	require.NotNil(t, a)
	require.Equal(t, key, a.Dispatch.Key, "the same key")
	require.Equal(t, 2, a.Dispatch.Attempt)
	require.Greater(t, a.Dispatch.Token, replay.Token, "a new fencing token")
	require.JSONEq(t, chargeArgs, string(a.Dispatch.Args))
	require.Equal(t, residual.Pending, f.get(key).State, "pending is durable before dispatch")

	for _, opts := range []interceptor.BeginOptions{{}, {Supersede: replay.Token}} {
		_, _, err := f.successor().Begin(f.ctx, charge(chargeArgs), opts)
		v := requireViolation(t, err, interceptor.InProgress, key)
		require.Equal(t, holderA, v.Holder)
	}

	res, err := a.Commit(context.Background(), ok(`{"id":"ch_2"}`), nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, a.Dispatch.Token, res.Token)
	_, replay, err = f.successor().Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
	require.NoError(t, err)
	require.JSONEq(t, `{"id":"ch_2"}`, string(replay.Output), "replays give the new intent's result")
	require.Equal(t, 2, replay.Attempt)
	r := f.get(key)
	require.Len(t, r.Attempts, 2)
	require.Equal(t, residual.Succeeded, r.Attempts[0].Outcome)
	require.Equal(t, first.Token, r.Attempts[0].Token)
}

// TestBeginSupersedeWithOtherArguments: a PayloadMismatch names the success it mismatched
// (ResidualToken); superseding it begins the new arguments as a new intent. After a
// resolution the attempt's token (Token) is not the success's, and names nothing.
func TestBeginSupersedeWithOtherArguments(t *testing.T) {
	t.Parallel()
	f := setup(t)
	key := f.key("payments.charge", "invoice:INV-42")
	_, err := f.ic.Do(f.ctx, charge(chargeArgs), answering(interceptor.Response{Status: 503}, nil).fn)
	requireViolation(t, err, interceptor.UnknownOutcome, key)
	f.clock.Advance(2 * testTTL)
	_, err = f.ic.Resolve(f.ctx, interceptor.ResolveParams{Key: key, As: residual.Succeeded, By: "ops", Note: "charged", Result: []byte(`"ch_1"`)})
	require.NoError(t, err)

	other := charge(`{"amount":99,"currency":"eur"}`)
	_, _, err = f.ic.Begin(f.ctx, other, interceptor.BeginOptions{})
	v := requireViolation(t, err, interceptor.PayloadMismatch, key)
	require.Greater(t, v.ResidualToken, v.Token, "a resolution took a token above its attempt's")
	_, _, err = f.ic.Begin(f.ctx, other, interceptor.BeginOptions{Supersede: v.Token})
	requireViolation(t, err, interceptor.PayloadMismatch, key)

	a, _, err := f.ic.Begin(f.ctx, other, interceptor.BeginOptions{Supersede: v.ResidualToken})
	require.NoError(t, err)
	require.Greater(t, a.Dispatch.Token, v.ResidualToken)
	digest, err := residual.Digest(other.Args)
	require.NoError(t, err)
	require.Equal(t, digest, f.get(key).RequestDigest, "the new intent's arguments are recorded")
	require.Nil(t, f.get(key).Result, "the earlier result is not the new intent's")
}

// TestBeginSupersedeKeepsTheBarrier: Supersede never passes an outcome that may have
// happened: over an unknown attempt it is an UnknownOutcome violation; when Settle resolves
// that attempt, the key's token has moved on, so the Begin again replays instead of
// dispatching. A stale token replays. An operation whose upstream deduplicates by the key
// cannot be superseded: nothing is written.
func TestBeginSupersedeKeepsTheBarrier(t *testing.T) {
	t.Parallel()
	f := setup(t)
	key := f.key("payments.charge", "invoice:INV-42")
	first, err := f.ic.Do(f.ctx, charge(chargeArgs), answering(ok(`"ch_1"`), nil).fn)
	require.NoError(t, err)
	a, _, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{Supersede: first.Token})
	require.NoError(t, err)
	f.clock.Advance(2 * testTTL) // the new attempt's holder crashed: its outcome is unknown

	_, _, err = f.successor().Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{Supersede: first.Token})
	requireViolation(t, err, interceptor.UnknownOutcome, key)
	_, _, err = f.successor().Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{Supersede: a.Dispatch.Token})
	requireViolation(t, err, interceptor.UnknownOutcome, key)

	settled := 0
	settle := func(ctx context.Context, v *interceptor.Violation) bool {
		settled++
		_, err := f.ic.Resolve(ctx, interceptor.ResolveParams{Key: v.Key, As: residual.Succeeded, By: "probe", Note: "found", Result: []byte(`"ch_2"`), IfToken: v.Token})
		return err == nil
	}
	got, replay, err := f.successor().Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{Supersede: a.Dispatch.Token, Settle: settle})
	require.NoError(t, err)
	require.Equal(t, 1, settled)
	require.Nil(t, got, "the resolution moved the token on: no dispatch")
	require.JSONEq(t, `"ch_2"`, string(replay.Output))

	require.NoError(t, f.ic.Register("payments.charge", interceptor.Operation{UpstreamIdempotent: true}))
	before := f.get(key)
	_, _, err = f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{Supersede: replay.Token})
	require.ErrorIs(t, err, interceptor.ErrInvalidCall)
	require.Contains(t, err.Error(), "upstream-idempotent")
	require.Equal(t, before.Token, f.get(key).Token, "nothing written")
	require.Equal(t, residual.Succeeded, f.get(key).State)
}

// TestBeginSupersedeConcurrentOneAttempt: eight callers superseding the same success at
// once: one gets the attempt, the others InProgress.
func TestBeginSupersedeConcurrentOneAttempt(t *testing.T) {
	t.Parallel()
	f := setup(t)
	key := f.key("payments.charge", "invoice:INV-42")
	first, err := f.ic.Do(f.ctx, charge(chargeArgs), answering(ok(`"ch_1"`), nil).fn)
	require.NoError(t, err)
	const n = 8
	attempts := make([]*interceptor.Attempt, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			attempts[i], _, errs[i] = f.successor().Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{Supersede: first.Token})
		})
	}
	wg.Wait()
	won := 0
	for i := range n {
		if attempts[i] != nil {
			won++
			continue
		}
		requireViolation(t, errs[i], interceptor.InProgress, key)
	}
	require.Equal(t, 1, won, "exactly one new attempt")
	require.Equal(t, 2, f.get(key).AttemptCount)
}
