package interceptor_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// TestBeginCommitHalves: Begin reserves and returns an attempt to dispatch once; Commit
// records the outcome under the fence; the next Begin replays without an attempt.
func TestBeginCommitHalves(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, replay, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
	require.NoError(t, err)
	require.Nil(t, replay)
	require.NotNil(t, a)
	require.Equal(t, f.key("payments.charge", "invoice:INV-42"), a.Dispatch.Key)
	require.Equal(t, 1, a.Dispatch.Attempt)
	require.Equal(t, holderA, a.Holder)
	require.Equal(t, epoch.Add(testTTL), a.Deadline(), "the local deadline is measured from before the reserve")
	require.Equal(t, residual.Pending, f.get(a.Dispatch.Key).State, "pending is durable before dispatch")

	res, err := a.Commit(context.Background(), ok(`{"id":"ch_1"}`), nil)
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, res.State)
	require.False(t, res.Replayed)

	a2, replay, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
	require.NoError(t, err)
	require.Nil(t, a2)
	require.True(t, replay.Replayed)
	require.JSONEq(t, `{"id":"ch_1"}`, string(replay.Output))
}

// TestBeginBlockedSaysWhetherTheRequestMatches: a blocked Begin is a violation that says
// whether the recorded request is this one, so surfaces need not read the ledger again.
func TestBeginBlockedSaysWhetherTheRequestMatches(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, _, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
	require.NoError(t, err)
	_, _, err = f.successor().Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
	v := requireViolation(t, err, interceptor.InProgress, f.key("payments.charge", "invoice:INV-42"))
	require.True(t, v.RequestMatches)
	_, _, err = f.successor().Begin(f.ctx, charge(`{"amount":1}`), interceptor.BeginOptions{})
	v = requireViolation(t, err, interceptor.InProgress, f.key("payments.charge", "invoice:INV-42"))
	require.False(t, v.RequestMatches)
}

// TestBeginLeaseWithinMargin: a per-call lease not longer than the margin is refused before
// anything is written.
func TestBeginLeaseWithinMargin(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, _, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{LeaseTTL: testMargin})
	require.ErrorIs(t, err, interceptor.ErrInvalidCall)
	require.Empty(t, f.list())
}

// TestReportChecksTheClaim: a success claimed over a 202 is refused with what to report
// instead, and nothing is written; the cautious claim is recorded.
func TestReportChecksTheClaim(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, _, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
	require.NoError(t, err)
	before := f.get(a.Dispatch.Key)

	_, err = a.Report(f.ctx, interceptor.Report{Outcome: residual.Succeeded, Status: 202, Handle: "/jobs/7"})
	var ce *interceptor.ClaimError
	require.ErrorAs(t, err, &ce)
	require.ErrorIs(t, err, interceptor.ErrClaimRefused)
	require.Equal(t, residual.Accepted, ce.Got)
	require.Contains(t, ce.Recovery, "outcome=accepted")
	require.Equal(t, before, f.get(a.Dispatch.Key), "a refused claim writes nothing")

	_, err = a.Report(f.ctx, interceptor.Report{Outcome: residual.Failed, Status: 503})
	require.ErrorAs(t, err, &ce)
	require.Equal(t, residual.Unknown, ce.Got, "a 503 does not prove that upstream did nothing")

	res, err := a.Report(f.ctx, interceptor.Report{Outcome: residual.Accepted, Status: 202, Handle: "/jobs/7"})
	v := requireViolation(t, err, interceptor.AwaitingUpstream, a.Dispatch.Key)
	require.Equal(t, "/jobs/7", v.Handle)
	require.Equal(t, residual.Accepted, res.State, "the recorded outcome comes with its violation")
	require.Equal(t, "/jobs/7", res.Handle)
}

// TestResumeProvesTheHolder: a later request resumes an attempt only with its token and
// holder; a wrong holder or a token never issued is lease_lost and writes nothing.
func TestResumeProvesTheHolder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, _, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{Holder: "mcp:agent#1"})
	require.NoError(t, err)
	key := a.Dispatch.Key

	_, err = f.ic.Resume(f.ctx, interceptor.ResumeParams{Key: key, Token: a.Dispatch.Token, Holder: "mcp:agent#2"})
	requireViolation(t, err, interceptor.LeaseLost, key)
	_, err = f.ic.Resume(f.ctx, interceptor.ResumeParams{Key: key, Token: a.Dispatch.Token + 5, Holder: "mcp:agent#1"})
	v := requireViolation(t, err, interceptor.LeaseLost, key)
	require.Contains(t, v.Error(), "never issued")
	refuse := errors.New("secret does not match")
	_, err = f.ic.Resume(f.ctx, interceptor.ResumeParams{Key: key, Token: a.Dispatch.Token, Authorize: func(string) error { return refuse }})
	require.ErrorIs(t, err, refuse)
	_, err = f.ic.Resume(f.ctx, interceptor.ResumeParams{Key: key, Token: a.Dispatch.Token})
	require.ErrorIs(t, err, interceptor.ErrInvalidCall, "no proof of holding")
	require.Equal(t, residual.Pending, f.get(key).State)

	r, err := f.ic.Resume(f.ctx, interceptor.ResumeParams{Key: key, Token: a.Dispatch.Token, Holder: "mcp:agent#1"})
	require.NoError(t, err)
	require.Equal(t, a.Dispatch.Attempt, r.Dispatch.Attempt)
	f.clock.Advance(testTTL / 2)
	l, err := r.Renew(f.ctx, testTTL)
	require.NoError(t, err)
	require.Equal(t, epoch.Add(testTTL/2+testTTL), l.Expires)
	res, err := r.Report(f.ctx, interceptor.Report{Outcome: residual.Succeeded, Result: []byte(`{"ok":true}`)})
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, res.State)
}

// TestRenewAfterTheFenceIsLost: a renewal after a successor took the key is lease_lost
// with the renewal's recovery.
func TestRenewAfterTheFenceIsLost(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, _, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
	require.NoError(t, err)
	f.clock.Advance(testTTL + time.Second)
	_, err = f.ic.Resolve(f.ctx, interceptor.ResolveParams{Key: a.Dispatch.Key, As: residual.Failed, By: "ops", Note: "checked: no charge"})
	require.NoError(t, err)
	_, err = a.Renew(f.ctx, 0)
	v := requireViolation(t, err, interceptor.LeaseLost, a.Dispatch.Key)
	require.Contains(t, v.Recovery, "can no longer be renewed")
}

// TestAbandonFreesTheKey: an attempt that was never dispatched is recorded failed and the
// key takes a new attempt.
func TestAbandonFreesTheKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, _, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
	require.NoError(t, err)
	require.NoError(t, a.Abandon(f.ctx, errors.New("request built without the tool's context")))
	r := f.get(a.Dispatch.Key)
	require.Equal(t, residual.Failed, r.State)
	require.Contains(t, r.Current().Error, "not dispatched")
	a2, _, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
	require.NoError(t, err)
	require.Equal(t, 2, a2.Dispatch.Attempt)
}

// TestRegisteredPolicyAppliesEverywhere: an operation registered after New is the policy
// of Do, of Begin and of interceptors of other namespaces made by ForNamespace.
func TestRegisteredPolicyAppliesEverywhere(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.NoError(t, f.ic.Register("payments.charge", interceptor.Operation{UpstreamIdempotent: true}))
	unknown := answering(interceptor.Response{Status: 503}, nil)
	_, err := f.ic.Do(f.ctx, charge(chargeArgs), unknown.fn)
	requireViolation(t, err, interceptor.UnknownOutcome, f.key("payments.charge", "invoice:INV-42"))

	// Begin re-dispatches the unknown call under the same key (upstream deduplicates it).
	a, _, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
	require.NoError(t, err, "an upstream-idempotent operation re-dispatches an unknown attempt")
	require.Equal(t, 2, a.Dispatch.Attempt)
	_, err = a.Commit(f.ctx, interceptor.Response{Status: 503}, nil)
	requireViolation(t, err, interceptor.UnknownOutcome, a.Dispatch.Key)
	res, err := f.ic.Do(f.ctx, charge(chargeArgs), answering(ok(`{}`), nil).fn)
	require.NoError(t, err)
	require.Equal(t, 3, res.Attempt)

	other, err := f.ic.ForNamespace("tenant-b")
	require.NoError(t, err)
	require.True(t, other.Operation("payments.charge").UpstreamIdempotent, "namespaces share the policies")
	require.NoError(t, other.Register("email.send", interceptor.Operation{LeaseTTL: time.Minute}))
	require.Equal(t, time.Minute, f.ic.Operation("email.send").LeaseTTL)
	_, err = f.ic.ForNamespace("")
	require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
}

// TestInvalidUTF8KeyFieldsAreRefused: different invalid byte strings must not collapse onto
// one key (a JSON decoder would turn each into U+FFFD); they are refused, nothing written.
func TestInvalidUTF8KeyFieldsAreRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tl := answering(ok(`{}`), nil)
	for name, c := range map[string]struct {
		task string
		call interceptor.Call
	}{
		"task":      {"run-\xff", charge(chargeArgs)},
		"operation": {testTask, interceptor.Call{Operation: "charge\xfe", Target: "invoice:1"}},
		"target":    {testTask, interceptor.Call{Operation: "charge", Target: "invoice:\xff"}},
	} {
		_, err := f.ic.Do(interceptor.WithTask(f.ctx, c.task), c.call, tl.fn)
		require.ErrorIs(t, err, interceptor.ErrInvalidCall, name)
		require.Contains(t, err.Error(), "UTF-8", name)
	}
	require.Zero(t, tl.count())
	require.Empty(t, f.list())
}

// redactCap is a config with a redactor that masks card numbers and a small result cap.
func redactCap(cfg *interceptor.Options) {
	cfg.MaxResult = 24
	cfg.Redact = func(_ string, b []byte) []byte { return bytes.ReplaceAll(b, []byte("4242"), []byte("****")) }
}

const secretResult = `{"card":"4242","note":"` + "0123456789012345678901234567890123456789" + `"}`

// requireRedactedCapped: a stored result is redacted, then cut at the cap, keeps the digest
// of the whole and is marked truncated.
func requireRedactedCapped(t *testing.T, r *residual.Residual) {
	t.Helper()
	require.NotContains(t, string(r.Result), "4242")
	require.True(t, strings.HasPrefix(string(r.Result), `{"card":"****"`), string(r.Result))
	require.Len(t, r.Result, 24)
	require.True(t, r.ResultTruncated)
	require.Equal(t, sha([]byte(secretResult)), r.ResultDigest)
}

// TestOnePathToStoreAResult: Do, Report, Resolve and Reconcile's probe results are all
// stored redacted, then capped.
func TestOnePathToStoreAResult(t *testing.T) {
	t.Parallel()
	t.Run("Do", func(t *testing.T) {
		t.Parallel()
		f := setup(t, withConfig(redactCap))
		res, err := f.ic.Do(f.ctx, charge(chargeArgs), answering(ok(secretResult), nil).fn)
		require.NoError(t, err)
		require.Equal(t, secretResult, string(res.Output), "the first caller gets the whole result")
		require.True(t, res.StoredTruncated)
		requireRedactedCapped(t, f.get(res.Key))
	})
	t.Run("Report", func(t *testing.T) {
		t.Parallel()
		f := setup(t, withConfig(redactCap))
		a, _, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
		require.NoError(t, err)
		_, err = a.Report(f.ctx, interceptor.Report{Outcome: residual.Succeeded, Result: []byte(secretResult)})
		require.NoError(t, err)
		requireRedactedCapped(t, f.get(a.Dispatch.Key))
	})
	t.Run("Resolve", func(t *testing.T) {
		t.Parallel()
		f := setup(t, withConfig(redactCap))
		_, err := f.ic.Do(f.ctx, charge(chargeArgs), answering(interceptor.Response{Status: 500}, nil).fn)
		require.Error(t, err)
		key := f.key("payments.charge", "invoice:INV-42")
		_, err = f.ic.Resolve(f.ctx, interceptor.ResolveParams{Key: key, As: residual.Succeeded, By: "ops", Note: "found it", Result: []byte(secretResult)})
		require.NoError(t, err)
		requireRedactedCapped(t, f.get(key))
	})
	t.Run("Reconcile", func(t *testing.T) {
		t.Parallel()
		f := setup(t, withConfig(redactCap), withConfig(func(cfg *interceptor.Options) {
			cfg.Operations = map[string]interceptor.Operation{"payments.charge": {
				Probe: func(context.Context, *residual.Residual) (interceptor.ProbeResult, error) {
					return interceptor.ProbeResult{Outcome: residual.Succeeded, Result: []byte(secretResult), Evidence: "found"}, nil
				},
			}}
		}))
		_, err := f.ic.Do(f.ctx, charge(chargeArgs), answering(interceptor.Response{Status: 500}, nil).fn)
		require.Error(t, err)
		rep, err := f.ic.Reconcile(f.ctx, interceptor.ReconcileParams{})
		require.NoError(t, err)
		require.Len(t, rep.Settled, 1)
		requireRedactedCapped(t, f.get(rep.Settled[0].Key))
	})
}

// TestResolveRefusesBadParameters: Resolve names what is wrong and writes nothing.
func TestResolveRefusesBadParameters(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, err := f.ic.Do(f.ctx, charge(chargeArgs), answering(interceptor.Response{Status: 500}, nil).fn)
	require.Error(t, err)
	key := f.key("payments.charge", "invoice:INV-42")
	before := f.get(key)
	for name, p := range map[string]interceptor.ResolveParams{
		"bad key":            {Key: "tf1_nope", As: residual.Failed, By: "ops", Note: "n"},
		"as pending":         {Key: key, As: residual.Pending, By: "ops", Note: "n"},
		"no note":            {Key: key, As: residual.Failed, By: "ops"},
		"no by":              {Key: key, As: residual.Failed, Note: "n"},
		"result with failed": {Key: key, As: residual.Failed, By: "ops", Note: "n", Result: []byte(`{}`)},
	} {
		_, err := f.ic.Resolve(f.ctx, p)
		require.ErrorIs(t, err, interceptor.ErrInvalidCall, name)
	}
	require.Equal(t, before, f.get(key))
}

// TestCommitRetryAfterALostAnswer: a commit that landed but whose answer was lost reads as
// "may or may not have been recorded"; the identical retry (Report over MCP-like surfaces,
// Commit from Go) is answered with the recorded outcome and writes nothing, while a
// different outcome under the same token is still refused as lease_lost.
func TestCommitRetryAfterALostAnswer(t *testing.T) {
	t.Parallel()
	t.Run("Report", func(t *testing.T) {
		t.Parallel()
		fl := &flakyLedger{}
		f := setup(t, withLedger(func(l ledger.Ledger) ledger.Ledger { fl.Ledger = l; return fl }))
		a, _, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
		require.NoError(t, err)
		rep := interceptor.Report{Outcome: residual.Succeeded, Status: 200, Body: []byte(`{"id":"ch_1"}`)}

		fl.commitLost.Store(true)
		_, err = a.Report(f.ctx, rep)
		require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
		require.ErrorContains(t, err, "may or may not have been recorded")
		landed := f.get(a.Dispatch.Key)
		require.Equal(t, residual.Succeeded, landed.State, "the first report had landed")

		f.clock.Advance(time.Second)
		res, err := a.Report(f.ctx, rep)
		require.NoError(t, err, "the identical retry is answered with the recorded outcome")
		require.Equal(t, residual.Succeeded, res.State)
		got := f.get(a.Dispatch.Key)
		require.Empty(t, got.Evidence, "no late-commit evidence")
		require.Equal(t, landed.UpdatedAt, got.UpdatedAt, "the retry wrote nothing")

		_, err = a.Report(f.ctx, interceptor.Report{Outcome: residual.Unknown})
		requireViolation(t, err, interceptor.LeaseLost, a.Dispatch.Key)
		require.Len(t, f.get(a.Dispatch.Key).Evidence, 1, "a different outcome is kept as evidence only")
	})
	t.Run("Commit", func(t *testing.T) {
		t.Parallel()
		fl := &flakyLedger{}
		f := setup(t, withLedger(func(l ledger.Ledger) ledger.Ledger { fl.Ledger = l; return fl }))
		a, _, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
		require.NoError(t, err)

		fl.commitLost.Store(true)
		_, err = a.Commit(f.ctx, ok(`{"id":"ch_1"}`), nil)
		v := requireViolation(t, err, interceptor.UnknownOutcome, a.Dispatch.Key)
		require.ErrorIs(t, v, ledger.ErrOutcomeUnknown)

		res, err := a.Commit(f.ctx, ok(`{"id":"ch_1"}`), nil)
		require.NoError(t, err)
		require.Equal(t, residual.Succeeded, res.State)
		require.JSONEq(t, `{"id":"ch_1"}`, string(res.Output))
		require.Empty(t, f.get(a.Dispatch.Key).Evidence)

		_, err = a.Commit(f.ctx, ok(`{"id":"ch_2"}`), nil)
		requireViolation(t, err, interceptor.LeaseLost, a.Dispatch.Key)
	})
}

// TestCommitAndReportAnswerAlike: Commit (the outcome classified from the tool's answer)
// and Report (the outcome the caller claims) answer each recorded outcome in one shape: the
// Result with State the outcome, and nil for succeeded, ErrCallFailed for failed, and the
// violation whose recovery is due for accepted and unknown, naming the attempt.
func TestCommitAndReportAnswerAlike(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		outcome residual.State
		resp    interceptor.Response
		kind    interceptor.Kind // "" for no violation
		failed  bool
	}{
		{residual.Succeeded, ok(`{"id":"ch_1"}`), "", false},
		{residual.Failed, interceptor.Response{Status: 400, Body: []byte(`{"error":"declined"}`)}, "", true},
		{residual.Accepted, interceptor.Response{Status: 202, Handle: "/jobs/7"}, interceptor.AwaitingUpstream, false},
		{residual.Unknown, interceptor.Response{Status: 503}, interceptor.UnknownOutcome, false},
	} {
		for _, via := range []string{"Commit", "Report"} {
			t.Run(via+"/"+c.outcome.String(), func(t *testing.T) {
				t.Parallel()
				f := setup(t)
				a, _, err := f.ic.Begin(f.ctx, charge(chargeArgs), interceptor.BeginOptions{})
				require.NoError(t, err)
				var res *interceptor.Result
				if via == "Commit" {
					res, err = a.Commit(f.ctx, c.resp, nil)
				} else {
					res, err = a.Report(f.ctx, interceptor.Report{Outcome: c.outcome, Status: c.resp.Status, Body: c.resp.Body, Handle: c.resp.Handle})
				}
				require.NotNil(t, res, "a recorded outcome comes with its Result")
				require.Equal(t, c.outcome, res.State)
				require.Equal(t, c.outcome, f.get(a.Dispatch.Key).State)
				switch {
				case c.failed:
					require.ErrorIs(t, err, interceptor.ErrCallFailed)
					require.ErrorContains(t, err, "upstream status 400")
					require.False(t, errors.As(err, new(*interceptor.Violation)), "a failed call is no violation")
				case c.kind != "":
					v := requireViolation(t, err, c.kind, a.Dispatch.Key)
					require.Equal(t, interceptor.Recovery(c.kind), v.Recovery)
					require.Equal(t, c.outcome, v.State)
					require.Equal(t, a.Dispatch.Attempt, v.Attempt)
					require.Equal(t, a.Dispatch.Token, v.Token)
					require.Equal(t, a.Holder, v.Holder)
					require.Equal(t, a.Since, v.Since)
					require.Equal(t, c.resp.Handle, v.Handle)
				default:
					require.NoError(t, err)
				}
			})
		}
	}
}
