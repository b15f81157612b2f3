package ledgertest

import (
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

var commitCases = []testCase{
	{"CommitSucceededReplays", commitSucceededReplays},
	{"CommitAcceptedAwaitsUpstream", commitAcceptedAwaitsUpstream},
	{"CommitFailedAllowsNewAttempt", commitFailedAllowsNewAttempt},
	{"CommitUnknownBlocks", commitUnknownBlocks},
	{"CommitStaleTokenRefused", commitStaleTokenRefused},
	{"CommitWrongHolderRefused", commitWrongHolderRefused},
	{"CommitAfterExpiryRefused", commitAfterExpiryRefused},
	{"CommitWithinMarginRefused", commitWithinMarginRefused},
	{"CommitIdenticalRetryAnswersRecorded", commitIdenticalRetryAnswersRecorded},
	{"CommitRetryAfterTakeoverOrResolve", commitRetryAfterTakeoverOrResolve},
	{"RenewExtendsLease", renewExtendsLease},
	{"RenewStaleTokenRefused", renewStaleTokenRefused},
	{"RenewAfterExpiryRefused", renewAfterExpiryRefused},
	{"CommitOrRenewOfMissingKeyLeaseLost", commitOrRenewOfMissingKeyLeaseLost},
}

// A commit of succeeded under the fence settles the residual, releases the lease and
// caches the result; the same request then replays, another request is a mismatch.
func commitSucceededReplays(e *env) {
	c := e.call("charge:cus_1")
	res := e.acquire(c.reserve("agent-a", "digest-1"))
	p := c.commit("agent-a", res.Lease.Token, residual.Succeeded)
	p.Result = []byte(`{"charge":"ch_1"}`)
	p.ResultDigest = "result-digest"
	p.ResponseDigest = "response-digest"
	r := e.commit(p)

	require.Equal(e.t, residual.Succeeded, r.State)
	require.Equal(e.t, p.Result, r.Result)
	require.Equal(e.t, "result-digest", r.ResultDigest)
	cur := r.Current()
	require.Equal(e.t, residual.Succeeded, cur.Outcome)
	require.True(e.t, cur.Released, "commit releases the lease")
	require.Equal(e.t, "response-digest", cur.ResponseDigest)

	got := e.get(c)
	require.Equal(e.t, residual.Succeeded, got.State)
	require.Equal(e.t, p.Result, got.Result)
	require.True(e.t, got.Current().Released)

	replay := e.reserve(c.reserve("agent-b", "digest-1"))
	require.Equal(e.t, ledger.Replay, replay.Decision)
	require.NoError(e.t, replay.Decision.Err())
	require.Equal(e.t, p.Result, replay.Residual.Result, "replay returns the cached result")
	require.Zero(e.t, replay.Lease)
	require.Len(e.t, replay.Residual.Attempts, 1, "a replay dispatches nothing")

	other := e.reserve(c.reserve("agent-b", "digest-2"))
	require.Equal(e.t, ledger.PayloadMismatch, other.Decision)
	require.ErrorIs(e.t, other.Decision.Err(), residual.ErrPayloadMismatch)

	// The released lease cannot be renewed any more.
	_, err := e.l.Renew(e.ctx, ledger.RenewParams{Namespace: c.ns, Key: c.key(), Holder: "agent-a", Token: res.Lease.Token, TTL: ttl})
	requireErr(e.t, err, residual.ErrLeaseLost)
	require.Len(e.t, e.get(c).Attempts, 1)
}

// A commit of accepted keeps the upstream handle; the next reserve awaits upstream.
func commitAcceptedAwaitsUpstream(e *env) {
	c := e.call("export:report-1")
	res := e.acquire(c.reserve("agent-a", "digest-1"))
	p := c.commit("agent-a", res.Lease.Token, residual.Accepted)
	p.Handle = "https://upstream.example/jobs/17"
	r := e.commit(p)
	require.Equal(e.t, residual.Accepted, r.State)
	require.Equal(e.t, p.Handle, r.Handle)

	next := e.reserve(c.reserve("agent-b", "digest-1"))
	require.Equal(e.t, ledger.AwaitingUpstream, next.Decision)
	require.ErrorIs(e.t, next.Decision.Err(), residual.ErrAwaitingUpstream)
	require.Equal(e.t, p.Handle, next.Residual.Handle, "the handle is kept for polling")
	require.Equal(e.t, residual.Accepted, next.Residual.State)

	// Accepted never turns into unknown by the passing of time.
	e.advance(pastTTL)
	require.Equal(e.t, residual.Accepted, e.get(c).State)
}

// A commit of failed lets the next reserve start attempt 2 under token 2.
func commitFailedAllowsNewAttempt(e *env) {
	c := e.call("email:carol@example.com")
	res := e.acquire(c.reserve("agent-a", "digest-1"))
	p := c.commit("agent-a", res.Lease.Token, residual.Failed)
	p.Error = "upstream said 400"
	r := e.commit(p)
	require.Equal(e.t, residual.Failed, r.State)
	require.Equal(e.t, "upstream said 400", r.Current().Error)

	next := e.acquire(c.reserve("agent-b", "digest-2"))
	require.Equal(e.t, uint64(2), next.Lease.Token)
	require.Len(e.t, next.Residual.Attempts, 2)
	require.Equal(e.t, 2, next.Residual.Attempts[1].N)
	require.Equal(e.t, residual.Failed, next.Residual.Attempts[0].Outcome)
	require.Equal(e.t, "digest-2", next.Residual.RequestDigest)
}

// A commit of unknown blocks the key until it is reconciled.
func commitUnknownBlocks(e *env) {
	c := e.call("sms:+15550100")
	res := e.acquire(c.reserve("agent-a", "digest-1"))
	r := e.commit(c.commit("agent-a", res.Lease.Token, residual.Unknown))
	require.Equal(e.t, residual.Unknown, r.State)
	require.True(e.t, r.Current().Released)

	next := e.reserve(c.reserve("agent-b", "digest-1"))
	require.Equal(e.t, ledger.UnknownOutcome, next.Decision)
	require.Len(e.t, e.get(c).Attempts, 1)
}

// requireEvidence asserts that the last evidence on r is the refused commit p.
func requireEvidence(e *env, r *residual.Residual, p ledger.CommitParams) {
	e.t.Helper()
	require.NotEmpty(e.t, r.Evidence, "a refused commit leaves evidence")
	ev := r.Evidence[len(r.Evidence)-1]
	require.Equal(e.t, p.Holder, ev.Holder)
	require.Equal(e.t, p.Token, ev.Token)
	require.Equal(e.t, p.Outcome, ev.Outcome)
	require.Equal(e.t, p.Result, ev.Result)
	require.NotEmpty(e.t, ev.Note)
}

// A commit carrying a stale token is refused, leaves evidence, and changes nothing else.
func commitStaleTokenRefused(e *env) {
	c := e.call("charge:cus_2")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	e.commit(c.commit("agent-a", a.Lease.Token, residual.Failed))
	b := e.acquire(c.reserve("agent-b", "digest-1"))
	require.Greater(e.t, b.Lease.Token, a.Lease.Token)

	p := c.commit("agent-a", a.Lease.Token, residual.Succeeded)
	p.Result = []byte(`"late"`)
	_, err := e.l.Commit(e.ctx, p)
	requireErr(e.t, err, residual.ErrLeaseLost)

	got := e.get(c)
	require.Equal(e.t, residual.Pending, got.State, "the live holder keeps the key")
	require.Equal(e.t, b.Lease.Token, got.Token)
	require.Equal(e.t, residual.None, got.Current().Outcome)
	require.Equal(e.t, "agent-b", got.Current().Holder)
	require.Empty(e.t, got.Result)
	requireEvidence(e, got, p)

	// The live holder still commits.
	r := e.commit(c.commit("agent-b", b.Lease.Token, residual.Succeeded))
	require.Equal(e.t, residual.Succeeded, r.State)
}

// A commit by another holder than the lease's is refused.
func commitWrongHolderRefused(e *env) {
	c := e.call("charge:cus_3")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	p := c.commit("mallory", a.Lease.Token, residual.Succeeded)
	_, err := e.l.Commit(e.ctx, p)
	requireErr(e.t, err, residual.ErrLeaseLost)

	got := e.get(c)
	require.Equal(e.t, residual.Pending, got.State)
	require.Equal(e.t, residual.None, got.Current().Outcome)
	require.False(e.t, got.Current().Released)
	requireEvidence(e, got, p)
}

// A commit after the lease expired is refused, and the residual reads unknown with the
// late observation as evidence.
func commitAfterExpiryRefused(e *env) {
	c := e.call("charge:cus_4")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	e.advance(pastTTL)

	p := c.commit("agent-a", a.Lease.Token, residual.Succeeded)
	p.Result = []byte(`{"charge":"ch_late"}`)
	r, err := e.l.Commit(e.ctx, p)
	requireErr(e.t, err, residual.ErrLeaseLost)
	if r != nil {
		require.Equal(e.t, residual.Unknown, r.State)
	}

	got := e.get(c)
	require.Equal(e.t, residual.Unknown, got.State)
	require.Empty(e.t, got.Result, "a late commit writes nothing authoritative")
	require.Equal(e.t, residual.None, got.Current().Outcome)
	requireEvidence(e, got, p)
}

// A commit with less than the margin left on the lease is refused with evidence.
func commitWithinMarginRefused(e *env) {
	c := e.call("charge:cus_5")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	e.advance(ttl - 20*time.Second) // 20s left

	p := c.commit("agent-a", a.Lease.Token, residual.Succeeded)
	p.Margin = 40 * time.Second
	_, err := e.l.Commit(e.ctx, p)
	requireErr(e.t, err, residual.ErrLeaseLost)

	got := e.get(c)
	require.Equal(e.t, residual.Pending, got.State, "the lease is still live, only too short")
	require.Equal(e.t, residual.None, got.Current().Outcome)
	requireEvidence(e, got, p)
}

// Renew extends the live lease to now+TTL; the renewed lease outlives the original expiry.
func renewExtendsLease(e *env) {
	c := e.call("deploy:web")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	e.advance(ttl / 2)

	before := e.now()
	l, err := e.l.Renew(e.ctx, ledger.RenewParams{Namespace: c.ns, Key: c.key(), Holder: "agent-a", Token: a.Lease.Token, TTL: ttl})
	after := e.now()
	require.NoError(e.t, err)
	require.Equal(e.t, a.Lease.Token, l.Token, "renewal keeps the token")
	require.Equal(e.t, "agent-a", l.Holder)
	e.requireTimeBetween(before.Add(ttl), after.Add(ttl), l.Expires, "renewed expiry is now+TTL")
	require.True(e.t, l.Expires.After(a.Lease.Expires))
	e.requireTime(l.Expires, e.get(c).Current().LeaseExpires, "stored renewed expiry")

	// Past the original expiry, before the renewed one: still pending, commit works.
	e.advance(ttl/2 + 10*time.Second)
	require.Equal(e.t, residual.Pending, e.get(c).State)
	r := e.commit(c.commit("agent-a", a.Lease.Token, residual.Succeeded))
	require.Equal(e.t, residual.Succeeded, r.State)
}

// Renew with a stale token is refused.
func renewStaleTokenRefused(e *env) {
	c := e.call("deploy:worker")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	e.commit(c.commit("agent-a", a.Lease.Token, residual.Failed))
	b := e.acquire(c.reserve("agent-b", "digest-1"))

	_, err := e.l.Renew(e.ctx, ledger.RenewParams{Namespace: c.ns, Key: c.key(), Holder: "agent-a", Token: a.Lease.Token, TTL: ttl})
	requireErr(e.t, err, residual.ErrLeaseLost)
	_, err = e.l.Renew(e.ctx, ledger.RenewParams{Namespace: c.ns, Key: c.key(), Holder: "agent-a", Token: b.Lease.Token, TTL: ttl})
	requireErr(e.t, err, residual.ErrLeaseLost, "the current token under another holder")
	e.requireTime(b.Lease.Expires, e.get(c).Current().LeaseExpires, "refused renewals change nothing")
}

// Renew after the lease expired is refused and does not revive the lease.
func renewAfterExpiryRefused(e *env) {
	c := e.call("deploy:cron")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	e.advance(pastTTL)
	_, err := e.l.Renew(e.ctx, ledger.RenewParams{Namespace: c.ns, Key: c.key(), Holder: "agent-a", Token: a.Lease.Token, TTL: ttl})
	requireErr(e.t, err, residual.ErrLeaseLost)
	require.Equal(e.t, residual.Unknown, e.get(c).State)
}

// A commit identical to one that landed (its first answer was lost) is answered with the
// stored residual and no error, and writes nothing; one that differs in outcome, result
// digest or handle is refused as a lost lease and kept as evidence.
func commitIdenticalRetryAnswersRecorded(e *env) {
	c := e.call("charge:retry")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	p := c.commit("agent-a", a.Lease.Token, residual.Succeeded)
	p.Result, p.ResultDigest, p.ResponseDigest, p.Handle = []byte(`{"id":1}`), "rd-1", "rd-1", "ch_1"
	first := e.commit(p)
	e.advance(time.Second)

	again, err := e.l.Commit(e.ctx, p)
	require.NoError(e.t, err, "an identical retry is answered as recorded")
	require.NotNil(e.t, again)
	require.Equal(e.t, residual.Succeeded, again.State)
	require.Equal(e.t, p.Result, again.Result)
	require.Empty(e.t, again.Evidence, "an identical retry writes no evidence")
	got := e.get(c)
	require.Empty(e.t, got.Evidence)
	e.requireTime(first.UpdatedAt, got.UpdatedAt, "an identical retry writes nothing")

	for name, mod := range map[string]func(*ledger.CommitParams){
		"outcome":       func(q *ledger.CommitParams) { q.Outcome = residual.Failed },
		"result digest": func(q *ledger.CommitParams) { q.ResultDigest = "rd-2" },
		"response":      func(q *ledger.CommitParams) { q.ResponseDigest = "rd-2" },
		"handle":        func(q *ledger.CommitParams) { q.Handle = "ch_2" },
		"holder":        func(q *ledger.CommitParams) { q.Holder = "agent-b" },
	} {
		q := p
		mod(&q)
		r, err := e.l.Commit(e.ctx, q)
		requireErr(e.t, err, residual.ErrLeaseLost, "a retry with another %s", name)
		require.NotNil(e.t, r, name)
		requireEvidence(e, r, q)
	}
	got = e.get(c)
	require.Equal(e.t, residual.Succeeded, got.State)
	require.Equal(e.t, p.Result, got.Result, "refused retries change nothing authoritative")
	require.Len(e.t, got.Evidence, 5)
}

// An identical retry is recognised even when the key has moved on: after a failed commit
// and a new attempt by another holder, and after a resolution of an accepted outcome. A
// holder whose attempt a resolution released (it never committed) is refused.
func commitRetryAfterTakeoverOrResolve(e *env) {
	c := e.call("charge:retry-takeover")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	failed := c.commit("agent-a", a.Lease.Token, residual.Failed)
	failed.Error = "card declined"
	e.commit(failed)
	b := e.acquire(c.reserve("agent-b", "digest-1"))

	r, err := e.l.Commit(e.ctx, failed)
	require.NoError(e.t, err, "the failed commit landed; its retry is answered as recorded")
	require.Equal(e.t, residual.Pending, r.State, "the answer is the stored residual, now under agent-b")
	got := e.get(c)
	require.Empty(e.t, got.Evidence)
	require.Equal(e.t, b.Lease.Token, got.Token)
	e.commit(c.commit("agent-b", b.Lease.Token, residual.Succeeded))

	// Accepted, then resolved as succeeded: the accepted commit's retry is still recorded.
	d := e.call("charge:retry-accepted")
	x := e.acquire(d.reserve("agent-a", "digest-1"))
	acc := d.commit("agent-a", x.Lease.Token, residual.Accepted)
	acc.Handle = "job-7"
	e.commit(acc)
	_, err = e.l.Resolve(e.ctx, d.resolve(residual.Succeeded))
	require.NoError(e.t, err)
	r, err = e.l.Commit(e.ctx, acc)
	require.NoError(e.t, err)
	require.Equal(e.t, residual.Succeeded, r.State)

	// Expired and resolved without a commit: the late holder's unknown is not "recorded".
	u := e.call("charge:retry-resolved")
	y := e.acquire(u.reserve("agent-a", "digest-1"))
	e.advance(pastTTL)
	_, err = e.l.Resolve(e.ctx, u.resolve(residual.Failed))
	require.NoError(e.t, err)
	late := u.commit("agent-a", y.Lease.Token, residual.Unknown)
	_, err = e.l.Commit(e.ctx, late)
	requireErr(e.t, err, residual.ErrLeaseLost, "a commit that never landed is refused")
	requireEvidence(e, e.get(u), late)
}

// A Commit or Renew of a key with no residual (never reserved, or collected by GC after
// its holder lost the lease) is a lost fence: an error wrapping residual.ErrLeaseLost and
// residual.ErrNotFound, with no residual returned and nothing written.
func commitOrRenewOfMissingKeyLeaseLost(e *env) {
	never := e.call("charge:never-reserved")
	_, err := e.l.Commit(e.ctx, never.commit("agent-a", 1, residual.Succeeded))
	requireErr(e.t, err, residual.ErrLeaseLost, "commit of a key never reserved")
	requireErr(e.t, err, residual.ErrNotFound, "commit of a key never reserved")
	_, err = e.l.Renew(e.ctx, ledger.RenewParams{Namespace: never.ns, Key: never.key(), Holder: "agent-a", Token: 1, TTL: ttl})
	requireErr(e.t, err, residual.ErrLeaseLost, "renew of a key never reserved")
	requireErr(e.t, err, residual.ErrNotFound, "renew of a key never reserved")
	_, err = e.l.Get(e.ctx, never.get())
	requireErr(e.t, err, residual.ErrNotFound, "a refused commit of a missing key writes nothing")

	// Finding 1 of docs/reliability.md: a holder's lease ends, another holder takes the key
	// and settles it, GC collects it; then the first holder commits and renews.
	c := e.call("charge:collected")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	e.advance(pastTTL)
	p := c.reserve("agent-b", "digest-1")
	p.Redispatch = true
	b := e.acquire(p)
	e.commit(c.commit("agent-b", b.Lease.Token, residual.Failed))
	e.advance(time.Hour)
	res, err := e.l.GC(e.ctx, ledger.GCParams{Namespace: c.ns, Before: e.now()})
	require.NoError(e.t, err)
	require.Equal(e.t, 1, res.Deleted)

	r, err := e.l.Commit(e.ctx, c.commit("agent-a", a.Lease.Token, residual.Accepted))
	requireErr(e.t, err, residual.ErrLeaseLost, "late commit of a collected key")
	requireErr(e.t, err, residual.ErrNotFound, "late commit of a collected key")
	require.Nil(e.t, r, "there is no residual to return")
	_, err = e.l.Renew(e.ctx, ledger.RenewParams{Namespace: c.ns, Key: c.key(), Holder: "agent-a", Token: a.Lease.Token, TTL: ttl})
	requireErr(e.t, err, residual.ErrLeaseLost, "late renew of a collected key")
	requireErr(e.t, err, residual.ErrNotFound, "late renew of a collected key")
	_, err = e.l.Get(e.ctx, c.get())
	requireErr(e.t, err, residual.ErrNotFound, "nothing is written for a refused commit of a collected key")
}
