package ledgertest

import (
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

var resolveCases = []testCase{
	{"ResolveLivePendingInProgress", resolveLivePendingInProgress},
	{"ResolveUnknownSucceeded", resolveUnknownSucceeded},
	{"ResolveUnknownFailed", resolveUnknownFailed},
	{"ResolveAcceptedSucceeded", resolveAcceptedSucceeded},
	{"ResolveSettledInvalid", resolveSettledInvalid},
	{"ResolveMissingNotFound", resolveMissingNotFound},
	{"ResolveIfTokenRefusesALaterAttempt", resolveIfTokenRefusesALaterAttempt},
	{"AppendEvidence", appendEvidence},
}

func (c call) resolve(as residual.State) ledger.ResolveParams {
	return ledger.ResolveParams{
		Namespace: c.ns, Key: c.key(), As: as, By: "ops:alice",
		Note: "checked upstream dashboard", Evidence: "upstream charge ch_9 exists",
	}
}

// A pending residual under a live lease cannot be resolved.
func resolveLivePendingInProgress(e *env) {
	c := e.call("charge:cus_10")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	_, err := e.l.Resolve(e.ctx, c.resolve(residual.Succeeded))
	requireErr(e.t, err, residual.ErrInProgress)

	got := e.get(c)
	require.Equal(e.t, residual.Pending, got.State)
	require.Equal(e.t, a.Lease.Token, got.Token, "a refused resolve takes no token")
	require.Empty(e.t, got.Resolutions)
}

// Resolving an unknown residual as succeeded takes a higher token, records who did it and
// why, caches the given result, and fences out the old holder's late commit.
func resolveUnknownSucceeded(e *env) {
	c := e.call("charge:cus_11")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	e.advance(pastTTL)

	p := c.resolve(residual.Succeeded)
	p.Result = []byte(`{"charge":"ch_9"}`)
	r, err := e.l.Resolve(e.ctx, p)
	require.NoError(e.t, err)
	require.Equal(e.t, residual.Succeeded, r.State)
	require.Greater(e.t, r.Token, a.Lease.Token, "resolve takes a new, higher token")
	require.Equal(e.t, p.Result, r.Result)
	require.Len(e.t, r.Resolutions, 1)
	res := r.Resolutions[0]
	require.Equal(e.t, "ops:alice", res.By)
	require.Equal(e.t, p.Note, res.Note)
	require.Equal(e.t, p.Evidence, res.Evidence)
	require.Equal(e.t, residual.Unknown, res.From)
	require.Equal(e.t, residual.Succeeded, res.To)
	require.Equal(e.t, r.Token, res.Token)
	require.True(e.t, r.Current().Released)

	got := e.get(c)
	require.Equal(e.t, residual.Succeeded, got.State)
	require.Equal(e.t, r.Token, got.Token)
	require.Len(e.t, got.Resolutions, 1)

	// The zombie holder wakes up and commits: refused, and the resolution stands.
	late := c.commit("agent-a", a.Lease.Token, residual.Failed)
	_, err = e.l.Commit(e.ctx, late)
	requireErr(e.t, err, residual.ErrLeaseLost)
	got = e.get(c)
	require.Equal(e.t, residual.Succeeded, got.State)
	require.Equal(e.t, p.Result, got.Result)
	requireEvidence(e, got, late)

	replay := e.reserve(c.reserve("agent-b", "digest-1"))
	require.Equal(e.t, ledger.Replay, replay.Decision)
	require.Equal(e.t, p.Result, replay.Residual.Result)
}

// Resolving an unknown residual as failed opens the key to a new attempt whose token is
// higher than the resolution's.
func resolveUnknownFailed(e *env) {
	c := e.call("charge:cus_12")
	e.acquire(c.reserve("agent-a", "digest-1"))
	e.advance(pastTTL)

	r, err := e.l.Resolve(e.ctx, c.resolve(residual.Failed))
	require.NoError(e.t, err)
	require.Equal(e.t, residual.Failed, r.State)
	require.Equal(e.t, residual.Unknown, r.Resolutions[0].From)
	require.Equal(e.t, residual.Failed, r.Resolutions[0].To)

	next := e.acquire(c.reserve("agent-b", "digest-1"))
	require.Greater(e.t, next.Lease.Token, r.Token, "tokens keep growing past a resolution")
	require.Len(e.t, next.Residual.Attempts, 2)
}

// An accepted residual can be resolved as succeeded once upstream confirms.
func resolveAcceptedSucceeded(e *env) {
	c := e.call("export:report-2")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	p := c.commit("agent-a", a.Lease.Token, residual.Accepted)
	p.Handle = "job-17"
	e.commit(p)

	r, err := e.l.Resolve(e.ctx, c.resolve(residual.Succeeded))
	require.NoError(e.t, err)
	require.Equal(e.t, residual.Succeeded, r.State)
	require.Equal(e.t, residual.Accepted, r.Resolutions[0].From)
	require.Greater(e.t, r.Token, a.Lease.Token)
	require.Equal(e.t, residual.Succeeded, e.get(c).State)
}

// A settled residual cannot be resolved again.
func resolveSettledInvalid(e *env) {
	c := e.call("charge:cus_13")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	e.commit(c.commit("agent-a", a.Lease.Token, residual.Succeeded))

	for _, as := range []residual.State{residual.Succeeded, residual.Failed} {
		_, err := e.l.Resolve(e.ctx, c.resolve(as))
		requireErr(e.t, err, residual.ErrInvalidTransition)
	}
	got := e.get(c)
	require.Equal(e.t, residual.Succeeded, got.State)
	require.Equal(e.t, a.Lease.Token, got.Token)
	require.Empty(e.t, got.Resolutions)
}

// A resolve conditional on attempt 1's token (what a probe looked at) is refused once a
// later attempt holds the key, even after that attempt's lease expired and it reads unknown
// again: the probe's answer is about attempt 1, and attempt 2 may have had an effect. With
// the current token it resolves; IfToken zero stays unconditional.
func resolveIfTokenRefusesALaterAttempt(e *env) {
	c := e.call("charge:cus_15")
	first := e.acquire(c.reserve("agent-a", "digest-1"))
	e.advance(pastTTL)
	p := c.reserve("agent-b", "digest-1")
	p.Redispatch = true
	second := e.acquire(p)
	e.advance(pastTTL)

	stale := c.resolve(residual.Failed)
	stale.IfToken = first.Lease.Token
	r, err := e.l.Resolve(e.ctx, stale)
	requireErr(e.t, err, residual.ErrTokenChanged)
	require.Nil(e.t, r)
	got := e.get(c)
	require.Equal(e.t, residual.Unknown, got.State, "the refused resolve wrote nothing")
	require.Equal(e.t, second.Lease.Token, got.Token, "a refused resolve takes no token")
	require.Empty(e.t, got.Resolutions)

	current := c.resolve(residual.Failed)
	current.IfToken = second.Lease.Token
	r, err = e.l.Resolve(e.ctx, current)
	require.NoError(e.t, err)
	require.Equal(e.t, residual.Failed, r.State)
	require.Greater(e.t, r.Token, second.Lease.Token)

	// Unconditional (IfToken zero) still resolves whatever is current.
	d := e.call("charge:cus_16")
	e.acquire(d.reserve("agent-a", "digest-1"))
	e.advance(pastTTL)
	r, err = e.l.Resolve(e.ctx, d.resolve(residual.Succeeded))
	require.NoError(e.t, err)
	require.Equal(e.t, residual.Succeeded, r.State)
}

// Resolving a key that has no residual is ErrNotFound.
func resolveMissingNotFound(e *env) {
	c := e.call("charge:nobody")
	_, err := e.l.Resolve(e.ctx, c.resolve(residual.Failed))
	requireErr(e.t, err, residual.ErrNotFound)
	_, err = e.l.Get(e.ctx, c.get())
	requireErr(e.t, err, residual.ErrNotFound, "a refused resolve creates nothing")
}

// AppendEvidence adds to an existing residual without changing its state, and is
// ErrNotFound for a missing one.
func appendEvidence(e *env) {
	missing := e.call("charge:ghost")
	_, err := e.l.AppendEvidence(e.ctx, ledger.EvidenceParams{
		Namespace: missing.ns, Key: missing.key(),
		Evidence: residual.Evidence{Holder: "probe", Note: "nothing"},
	})
	requireErr(e.t, err, residual.ErrNotFound)
	_, err = e.l.Get(e.ctx, missing.get())
	requireErr(e.t, err, residual.ErrNotFound, "evidence on a missing key creates nothing")

	c := e.call("charge:cus_14")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	for i, note := range []string{"probe: upstream has no record", "probe: still nothing"} {
		r, err := e.l.AppendEvidence(e.ctx, ledger.EvidenceParams{
			Namespace: c.ns, Key: c.key(),
			Evidence: residual.Evidence{Holder: "probe", Outcome: residual.Failed, Note: note},
		})
		require.NoError(e.t, err)
		require.Len(e.t, r.Evidence, i+1)
		require.Equal(e.t, note, r.Evidence[i].Note)
		require.Equal(e.t, residual.Pending, r.State, "evidence never changes the state")
	}
	got := e.get(c)
	require.Len(e.t, got.Evidence, 2)
	require.Equal(e.t, "probe", got.Evidence[0].Holder)
	require.Equal(e.t, residual.Failed, got.Evidence[0].Outcome)
	require.Equal(e.t, residual.Pending, got.State)
	require.Equal(e.t, a.Lease.Token, got.Token)
}
