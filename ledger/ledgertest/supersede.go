package ledgertest

import (
	"fmt"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

var supersedeCases = []testCase{
	{"SupersedeSucceededAcquires", supersedeSucceededAcquires},
	{"SupersedeResolvedSuccessNamesItsToken", supersedeResolvedSuccessNamesItsToken},
	{"SupersedeStaleTokenIsDecidedAsWithout", supersedeStaleTokenIsDecidedAsWithout},
	{"SupersedeNeverPassesAnOpenOutcome", supersedeNeverPassesAnOpenOutcome},
	{"SupersedeConcurrentOneWinner", supersedeConcurrentOneWinner},
}

// succeed reserves c as holder with digest and commits the attempt succeeded with result;
// it returns the residual's token, which Supersede names.
func (e *env) succeed(c call, holder, digest, result string) uint64 {
	e.t.Helper()
	res := e.acquire(c.reserve(holder, digest))
	p := c.commit(holder, res.Lease.Token, residual.Succeeded)
	p.Result, p.ResultDigest, p.ResponseDigest = []byte(result), "rd-"+result, "resp-"+result
	r := e.commit(p)
	require.Equal(e.t, residual.Succeeded, r.State)
	return r.Token
}

// supersede returns c's reserve by holder with digest over the success under token.
func (c call) supersede(holder, digest string, token uint64) ledger.ReserveParams {
	p := c.reserve(holder, digest)
	p.Supersede = token
	return p
}

// A reserve whose Supersede names the token of a success starts a new intent on the same
// key: attempt n+1 pending under a new lease and a higher token, with the new request
// digest (the same or another), the earlier attempts kept and the cached result cleared.
// Until it settles the key blocks like any pending one; its commit works, and replays give
// the new result. Three intents in a row keep all three attempts in order.
func supersedeSucceededAcquires(e *env) {
	c := e.call("file:/tmp/report.txt")
	first := e.succeed(c, "agent-a", "digest-1", `"v1"`)

	before := e.now()
	res := e.acquire(c.supersede("agent-b", "digest-1", first))
	r := res.Residual
	require.Greater(e.t, res.Lease.Token, first, "a new intent gets a higher token")
	require.Equal(e.t, "agent-b", res.Lease.Holder)
	e.requireTimeBetween(before.Add(ttl), e.now().Add(ttl), res.Lease.Expires, "a new lease of the TTL")
	require.Equal(e.t, residual.Pending, r.State)
	require.Equal(e.t, res.Lease.Token, r.Token)
	require.Equal(e.t, 2, r.AttemptCount)
	require.Len(e.t, r.Attempts, 2, "the settled attempt stays in the history")
	require.Equal(e.t, residual.Succeeded, r.Attempts[0].Outcome)
	require.Equal(e.t, "resp-\"v1\"", r.Attempts[0].ResponseDigest)
	require.Equal(e.t, 2, r.Attempts[1].N)
	require.Equal(e.t, res.Lease.Token, r.Attempts[1].Token)
	require.Equal(e.t, residual.None, r.Attempts[1].Outcome)
	require.Nil(e.t, r.Result, "the earlier intent's result is never the new one's")
	require.Empty(e.t, r.ResultDigest)

	got := e.get(c)
	require.Equal(e.t, residual.Pending, got.State)
	require.Equal(e.t, res.Lease.Token, got.Token)
	require.Len(e.t, got.Attempts, 2)
	require.Nil(e.t, got.Result)
	for _, p := range []ledger.ReserveParams{c.reserve("agent-c", "digest-1"), c.supersede("agent-c", "digest-1", first)} {
		blocked := e.reserve(p)
		require.Equal(e.t, ledger.InProgress, blocked.Decision, "the new intent blocks its key while pending")
		require.Equal(e.t, "agent-b", blocked.Residual.Current().Holder)
	}

	p := c.commit("agent-b", res.Lease.Token, residual.Succeeded)
	p.Result, p.ResultDigest = []byte(`"v2"`), "rd-v2"
	e.commit(p)
	replay := e.reserve(c.reserve("agent-c", "digest-1"))
	require.Equal(e.t, ledger.Replay, replay.Decision)
	require.Equal(e.t, `"v2"`, string(replay.Residual.Result), "a replay gives the new intent's result")
	require.Equal(e.t, res.Lease.Token, replay.Residual.Token)

	// A third intent with other arguments: its digest is recorded.
	third := e.acquire(c.supersede("agent-c", "digest-2", res.Lease.Token))
	require.Greater(e.t, third.Lease.Token, res.Lease.Token)
	require.Equal(e.t, "digest-2", third.Residual.RequestDigest)
	require.Equal(e.t, "digest-2", third.Residual.Current().RequestDigest)
	got = e.get(c)
	require.Equal(e.t, 3, got.AttemptCount)
	require.Len(e.t, got.Attempts, 3)
	for i, want := range []residual.State{residual.Succeeded, residual.Succeeded, residual.None} {
		require.Equal(e.t, i+1, got.Attempts[i].N)
		require.Equal(e.t, want, got.Attempts[i].Outcome, "attempt %d", i+1)
	}
	require.Equal(e.t, "digest-1", got.Attempts[0].RequestDigest)
	require.Equal(e.t, "digest-2", got.Attempts[2].RequestDigest)
}

// A success settled by a resolution carries the resolution's token (above its attempt's):
// Supersede names that one. The attempt's older token is stale.
func supersedeResolvedSuccessNamesItsToken(e *env) {
	c := e.call("charge:cus_20")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	e.advance(pastTTL)
	resolved, err := e.l.Resolve(e.ctx, c.resolve(residual.Succeeded))
	require.NoError(e.t, err)
	require.Greater(e.t, resolved.Token, a.Lease.Token)

	stale := e.reserve(c.supersede("agent-b", "digest-1", a.Lease.Token))
	require.Equal(e.t, ledger.Replay, stale.Decision, "the attempt's token is not the success's")
	res := e.acquire(c.supersede("agent-b", "digest-1", resolved.Token))
	require.Greater(e.t, res.Lease.Token, resolved.Token)
	require.Len(e.t, res.Residual.Resolutions, 1, "the resolution stays in the audit")
	require.Equal(e.t, 2, res.Residual.AttemptCount)
}

// A Supersede whose token is not the success's (it was superseded and settled again since)
// is decided as without it: Replay for the same digest, PayloadMismatch for another, and
// nothing is written.
func supersedeStaleTokenIsDecidedAsWithout(e *env) {
	c := e.call("toggle:lamp")
	first := e.succeed(c, "agent-a", "digest-1", `"on"`)
	second := e.acquire(c.supersede("agent-b", "digest-1", first))
	e.commit(c.commit("agent-b", second.Lease.Token, residual.Succeeded))
	before := e.get(c)

	for digest, want := range map[string]ledger.Decision{"digest-1": ledger.Replay, "digest-2": ledger.PayloadMismatch} {
		for _, token := range []uint64{first, second.Lease.Token + 1, ledger.MaxToken} {
			res := e.reserve(c.supersede("agent-c", digest, token))
			require.Equal(e.t, want, res.Decision, "digest %s, supersede %d", digest, token)
			require.Zero(e.t, res.Lease)
			require.Equal(e.t, residual.Succeeded, res.Residual.State)
		}
	}
	after := e.get(c)
	require.Equal(e.t, before.Token, after.Token, "a stale supersede takes no token")
	require.Equal(e.t, before.AttemptCount, after.AttemptCount, "and writes no attempt")
	require.Equal(e.t, residual.Succeeded, after.State)
	e.requireTime(before.UpdatedAt, after.UpdatedAt, "nothing written")
}

// Supersede never lets a second dispatch past an outcome that may have happened: over a
// pending, unknown or accepted residual it is decided as without it (even when it names
// the residual's own token), and nothing is written; over a failed one it acquires, as
// without it. A superseded key is pending, so GC never collects it.
func supersedeNeverPassesAnOpenOutcome(e *env) {
	c := e.call("deploy:web")
	first := e.succeed(c, "agent-a", "digest-1", `"ok"`)
	second := e.acquire(c.supersede("agent-b", "digest-1", first))
	tok := second.Lease.Token

	gc, err := e.l.GC(e.ctx, ledger.GCParams{Namespace: c.ns, Before: e.now().Add(24 * time.Hour)})
	require.NoError(e.t, err)
	require.Zero(e.t, gc.Deleted, "a superseded key is pending: never collected")

	check := func(want ledger.Decision, state residual.State) {
		e.t.Helper()
		before := e.get(c)
		for _, token := range []uint64{first, tok} {
			for _, digest := range []string{"digest-1", "digest-2"} {
				res := e.reserve(c.supersede("agent-c", digest, token))
				require.Equal(e.t, want, res.Decision, "supersede %d with %s over %s", token, digest, state)
				require.Equal(e.t, state, res.Residual.State)
				require.Zero(e.t, res.Lease)
			}
		}
		after := e.get(c)
		require.Equal(e.t, before.Token, after.Token, "%s: no token taken", state)
		require.Equal(e.t, before.AttemptCount, after.AttemptCount, "%s: no attempt written", state)
	}
	check(ledger.InProgress, residual.Pending)
	e.advance(pastTTL)
	check(ledger.UnknownOutcome, residual.Unknown)

	a := e.call("export:report-2")
	ra := e.acquire(a.reserve("agent-a", "digest-1"))
	p := a.commit("agent-a", ra.Lease.Token, residual.Accepted)
	p.Handle = "https://upstream.example/jobs/18"
	e.commit(p)
	res := e.reserve(a.supersede("agent-b", "digest-1", ra.Lease.Token))
	require.Equal(e.t, ledger.AwaitingUpstream, res.Decision)
	require.Equal(e.t, residual.Accepted, e.get(a).State)
	require.Equal(e.t, 1, e.get(a).AttemptCount)

	f := e.call("email:dan@example.com")
	rf := e.acquire(f.reserve("agent-a", "digest-1"))
	e.commit(f.commit("agent-a", rf.Lease.Token, residual.Failed))
	again := e.acquire(f.supersede("agent-b", "digest-1", rf.Lease.Token))
	require.Equal(e.t, 2, again.Residual.AttemptCount, "a failed key acquires, with or without Supersede")
}

// 32 reserves superseding the same success at once: exactly one acquires, every other one
// is told the key is in progress under the winner (never a replay of the superseded
// success), and the residual has exactly one new attempt.
func supersedeConcurrentOneWinner(e *env) {
	c := e.call("invoice:INV-43")
	first := e.succeed(c, "agent-a", "digest-1", `"sent"`)
	winner := e.oneWinner(32, func(i int) ledger.ReserveParams {
		return c.supersede(fmt.Sprintf("proxy-%02d", i), "digest-1", first)
	})
	got := e.get(c)
	require.Equal(e.t, 2, got.AttemptCount, "one new attempt")
	require.Equal(e.t, first+1, got.Token, "losers take no token")
	require.Equal(e.t, winner, got.Current().Holder)
}
