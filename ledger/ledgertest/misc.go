package ledgertest

import (
	"context"
	"strings"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

var miscCases = []testCase{
	{"GetMissingNotFound", getMissingNotFound},
	{"InvalidParamsWriteNothing", invalidParamsWriteNothing},
	{"BoundsRefusedByEveryStep", boundsRefusedByEveryStep},
	{"InvalidKeyRefusedByEveryMethod", invalidKeyRefusedByEveryMethod},
	{"InvalidNamespaceRefusedByEveryMethod", invalidNamespaceRefusedByEveryMethod},
	{"ClosedLedgerRefuses", closedLedgerRefuses},
	{"ReopenKeepsState", reopenKeepsState},
	{"WatchDeliversChanges", watchDeliversChanges},
}

// Every step refuses a field over its bound (ledger.MaxField, MaxText, MaxResult), a holder
// or resolver with a control character, and a lease longer than ledger.MaxLease, with an
// error wrapping ledger.ErrInvalidParams that names the field; nothing is written. Fields
// at their bound are taken.
func boundsRefusedByEveryStep(e *env) {
	long := func(n int) string { return strings.Repeat("x", n) }
	c := e.call("bounds:1")
	for _, tc := range []struct {
		field string
		edit  func(*ledger.ReserveParams)
	}{
		{"holder", func(p *ledger.ReserveParams) { p.Holder = long(ledger.MaxField + 1) }},
		{"holder", func(p *ledger.ReserveParams) { p.Holder = "agent\x1b[31m" }},
		{"holder", func(p *ledger.ReserveParams) { p.Holder = "agent\nforged: line" }},
		{"request digest", func(p *ledger.ReserveParams) { p.RequestDigest = long(ledger.MaxField + 1) }},
		{"lease ttl", func(p *ledger.ReserveParams) { p.TTL = ledger.MaxLease + time.Second }},
		{"supersede", func(p *ledger.ReserveParams) { p.Supersede = ledger.MaxToken + 1 }},
		{"target", func(p *ledger.ReserveParams) {
			p.Target = long(ledger.MaxField + 1)
			p.Key = residual.Key(p.Namespace, p.Task, p.Operation, p.Target)
		}},
	} {
		p := c.reserve("agent-a", "digest-1")
		tc.edit(&p)
		_, err := e.l.Reserve(e.ctx, p)
		requireErr(e.t, err, ledger.ErrInvalidParams, "reserve with a bad "+tc.field)
		require.Contains(e.t, err.Error(), tc.field)
		_, err = e.l.Get(e.ctx, ledger.GetParams{Namespace: p.Namespace, Key: p.Key})
		requireErr(e.t, err, residual.ErrNotFound, "nothing was reserved")
	}

	p := c.reserve(long(ledger.MaxField), "digest-1")
	p.TTL = ledger.MaxLease
	// Supersede at its bound names no success: a new key acquires as without it.
	p.Supersede = ledger.MaxToken
	r := e.acquire(p) // at the bounds
	holder, token := p.Holder, r.Lease.Token
	_, err := e.l.Renew(e.ctx, ledger.RenewParams{Namespace: c.ns, Key: c.key(), Holder: holder, Token: token, TTL: ledger.MaxLease + 1})
	requireErr(e.t, err, ledger.ErrInvalidParams, "renew past the longest lease")
	for _, tc := range []struct {
		field string
		edit  func(*ledger.CommitParams)
	}{
		{"error", func(p *ledger.CommitParams) { p.Error = long(ledger.MaxText + 1) }},
		{"handle", func(p *ledger.CommitParams) { p.Handle = long(ledger.MaxText + 1) }},
		{"result", func(p *ledger.CommitParams) { p.Result = []byte(long(ledger.MaxResult + 1)) }},
	} {
		cp := c.commit(holder, token, residual.Unknown)
		tc.edit(&cp)
		_, err := e.l.Commit(e.ctx, cp)
		requireErr(e.t, err, ledger.ErrInvalidParams, "commit with a bad "+tc.field)
		require.Contains(e.t, err.Error(), tc.field)
	}
	_, err = e.l.AppendEvidence(e.ctx, ledger.EvidenceParams{Namespace: c.ns, Key: c.key(),
		Evidence: residual.Evidence{Holder: "h", Note: long(ledger.MaxText + 1)}})
	requireErr(e.t, err, ledger.ErrInvalidParams, "evidence with a long note")
	_, err = e.l.AppendEvidence(e.ctx, ledger.EvidenceParams{Namespace: c.ns, Key: c.key(),
		Evidence: residual.Evidence{Holder: "h", Result: []byte(long(ledger.MaxResult + 1))}})
	requireErr(e.t, err, ledger.ErrInvalidParams, "evidence with a large result")
	got := e.get(c)
	require.Empty(e.t, got.Evidence, "no refused step left evidence")
	require.Equal(e.t, residual.Pending, got.State, "no refused step settled the attempt")

	cp := c.commit(holder, token, residual.Unknown)
	cp.Error = long(ledger.MaxText)
	require.Equal(e.t, residual.Unknown, e.commit(cp).State, "an error text at the bound is taken")
	for _, rp := range []ledger.ResolveParams{
		{Namespace: c.ns, Key: c.key(), As: residual.Failed, By: "ops", Note: long(ledger.MaxText + 1)},
		{Namespace: c.ns, Key: c.key(), As: residual.Failed, By: "ops\u0007"},
		{Namespace: c.ns, Key: c.key(), As: residual.Succeeded, By: "ops", Result: []byte(long(ledger.MaxResult + 1))},
	} {
		_, err := e.l.Resolve(e.ctx, rp)
		requireErr(e.t, err, ledger.ErrInvalidParams, "resolve over a bound")
	}
	require.Equal(e.t, residual.Unknown, e.get(c).State, "no refused resolve settled the key")
}

// Get of a key without a residual wraps residual.ErrNotFound.
func getMissingNotFound(e *env) {
	c := e.call("nothing:here")
	r, err := e.l.Get(e.ctx, c.get())
	requireErr(e.t, err, residual.ErrNotFound)
	require.Nil(e.t, r)
}

// Malformed parameters are refused with errors wrapping ledger.ErrInvalidParams or
// residual.ErrInvalidKey, and nothing is written.
func invalidParamsWriteNothing(e *env) {
	c := e.call("invalid:1")
	bad := []struct {
		name   string
		p      ledger.ReserveParams
		target error
	}{
		{"bad key", func() ledger.ReserveParams { p := c.reserve("agent-a", "d"); p.Key = "tf1_NOTHEX"; return p }(), residual.ErrInvalidKey},
		{"empty holder", c.reserve("", "d"), ledger.ErrInvalidParams},
		{"empty digest", c.reserve("agent-a", ""), ledger.ErrInvalidParams},
		{"zero ttl", func() ledger.ReserveParams { p := c.reserve("agent-a", "d"); p.TTL = 0; return p }(), ledger.ErrInvalidParams},
		{"empty namespace", func() ledger.ReserveParams { p := c.reserve("agent-a", "d"); p.Namespace = ""; return p }(), ledger.ErrInvalidParams},
	}
	for _, b := range bad {
		_, err := e.l.Reserve(e.ctx, b.p)
		requireErr(e.t, err, b.target, b.name)
	}
	_, err := e.l.Get(e.ctx, c.get())
	requireErr(e.t, err, residual.ErrNotFound, "refused reserves write nothing")

	a := e.acquire(c.reserve("agent-a", "digest-1"))
	p := c.commit("agent-a", a.Lease.Token, residual.Pending)
	_, err = e.l.Commit(e.ctx, p)
	requireErr(e.t, err, ledger.ErrInvalidParams, "commit outcome pending")
	p.Outcome = residual.State("done")
	_, err = e.l.Commit(e.ctx, p)
	requireErr(e.t, err, ledger.ErrInvalidParams, "commit outcome done")
	_, err = e.l.Renew(e.ctx, ledger.RenewParams{Namespace: c.ns, Key: c.key(), Holder: "agent-a", Token: a.Lease.Token})
	requireErr(e.t, err, ledger.ErrInvalidParams, "renew with zero ttl")
	_, err = e.l.Resolve(e.ctx, ledger.ResolveParams{Namespace: c.ns, Key: c.key(), As: residual.Pending, By: "ops"})
	requireErr(e.t, err, ledger.ErrInvalidParams, "resolve as pending")

	got := e.get(c)
	require.Equal(e.t, residual.Pending, got.State)
	require.Equal(e.t, residual.None, got.Current().Outcome)
	require.Empty(e.t, got.Evidence, "a refused call is not evidence")
	require.Empty(e.t, got.Resolutions)
	require.Equal(e.t, a.Lease.Token, got.Token)
	require.Len(e.t, e.list(ledger.ListParams{Namespace: c.ns}), 1)
}

// keyedSteps calls every keyed method of l with namespace ns and key k (the other
// parameters valid) and returns each error by method name.
func keyedSteps(e *env, ns, k string) map[string]error {
	errs := map[string]error{}
	_, errs["Reserve"] = e.l.Reserve(e.ctx, ledger.ReserveParams{
		Namespace: ns, Key: k, Task: "t", Operation: "o", Target: "x", Holder: "agent-a", RequestDigest: "d", TTL: ttl,
	})
	_, errs["Commit"] = e.l.Commit(e.ctx, ledger.CommitParams{Namespace: ns, Key: k, Holder: "agent-a", Token: 1, Outcome: residual.Succeeded})
	_, errs["Renew"] = e.l.Renew(e.ctx, ledger.RenewParams{Namespace: ns, Key: k, Holder: "agent-a", Token: 1, TTL: ttl})
	_, errs["Resolve"] = e.l.Resolve(e.ctx, ledger.ResolveParams{Namespace: ns, Key: k, As: residual.Failed, By: "ops"})
	_, errs["AppendEvidence"] = e.l.AppendEvidence(e.ctx, ledger.EvidenceParams{Namespace: ns, Key: k, Evidence: residual.Evidence{Holder: "x", Note: "n"}})
	_, errs["Get"] = e.l.Get(e.ctx, ledger.GetParams{Namespace: ns, Key: k})
	return errs
}

// Every method that names a key refuses a malformed one the same way, on every backend:
// an error wrapping both ledger.ErrInvalidParams and residual.ErrInvalidKey, before
// anything is read or written (an existing residual is not touched).
func invalidKeyRefusedByEveryMethod(e *env) {
	c := e.call("badkey:1")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	good := c.key()
	for name, k := range map[string]string{
		"empty":           "",
		"no prefix":       good[len(residual.KeyPrefix):],
		"upper-case hex":  residual.KeyPrefix + strings.ToUpper(good[len(residual.KeyPrefix):]),
		"short":           good[:len(good)-1],
		"long":            good + "0",
		"other prefix":    "tf2_" + good[len(residual.KeyPrefix):],
		"NUL":             good[:len(good)-1] + "\x00",
		"invalid UTF-8":   good[:len(good)-1] + "\xff",
		"trailing spaces": good + " ",
	} {
		for method, err := range keyedSteps(e, c.ns, k) {
			requireErr(e.t, err, ledger.ErrInvalidParams, "%s with a key that is %s", method, name)
			requireErr(e.t, err, residual.ErrInvalidKey, "%s with a key that is %s", method, name)
		}
	}
	got := e.get(c)
	require.Equal(e.t, residual.Pending, got.State)
	require.Equal(e.t, a.Lease.Token, got.Token)
	require.Len(e.t, got.Attempts, 1)
	require.Empty(e.t, got.Evidence)
	require.Empty(e.t, got.Resolutions)
}

// Every method refuses an empty namespace, and one holding a NUL byte, with an error
// wrapping ledger.ErrInvalidParams (GC accepts an empty namespace: every namespace).
func invalidNamespaceRefusedByEveryMethod(e *env) {
	c := e.call("badns:1")
	for name, ns := range map[string]string{"empty": "", "NUL": c.ns + "\x00x"} {
		for method, err := range keyedSteps(e, ns, c.key()) {
			requireErr(e.t, err, ledger.ErrInvalidParams, "%s with a namespace that is %s", method, name)
			require.NotErrorIs(e.t, err, residual.ErrInvalidKey, "%s: the key is fine", method)
		}
		_, err := e.l.List(e.ctx, ledger.ListParams{Namespace: ns})
		requireErr(e.t, err, ledger.ErrInvalidParams, "List with a namespace that is %s", name)
	}
	_, err := e.l.GC(e.ctx, ledger.GCParams{Namespace: c.ns + "\x00x", Before: e.now()})
	requireErr(e.t, err, ledger.ErrInvalidParams, "GC with a namespace holding NUL")
	_, err = e.l.List(e.ctx, ledger.ListParams{Namespace: c.ns, States: []residual.State{"done"}})
	requireErr(e.t, err, ledger.ErrInvalidParams, "List with an unknown state")
	requireErr(e.t, err, residual.ErrInvalidState, "List with an unknown state")
}

// Every call after Close wraps lease.ErrClosed.
func closedLedgerRefuses(e *env) {
	c := e.call("closed:1")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	require.NoError(e.t, e.l.Close())

	_, err := e.l.Reserve(e.ctx, c.reserve("agent-b", "digest-1"))
	requireErr(e.t, err, lease.ErrClosed, "reserve")
	_, err = e.l.Commit(e.ctx, c.commit("agent-a", a.Lease.Token, residual.Succeeded))
	requireErr(e.t, err, lease.ErrClosed, "commit")
	_, err = e.l.Renew(e.ctx, ledger.RenewParams{Namespace: c.ns, Key: c.key(), Holder: "agent-a", Token: a.Lease.Token, TTL: ttl})
	requireErr(e.t, err, lease.ErrClosed, "renew")
	_, err = e.l.Resolve(e.ctx, c.resolve(residual.Failed))
	requireErr(e.t, err, lease.ErrClosed, "resolve")
	_, err = e.l.AppendEvidence(e.ctx, ledger.EvidenceParams{Namespace: c.ns, Key: c.key()})
	requireErr(e.t, err, lease.ErrClosed, "append evidence")
	_, err = e.l.Get(e.ctx, c.get())
	requireErr(e.t, err, lease.ErrClosed, "get")
	_, err = e.l.List(e.ctx, ledger.ListParams{Namespace: c.ns})
	requireErr(e.t, err, lease.ErrClosed, "list")
	_, err = e.l.GC(e.ctx, ledger.GCParams{Before: e.now()})
	requireErr(e.t, err, lease.ErrClosed, "gc")
	if w, ok := e.l.(ledger.Watcher); ok {
		_, err = w.Watch(e.ctx, c.ns)
		requireErr(e.t, err, lease.ErrClosed, "watch")
	}
}

// Closing and reopening the store keeps residuals, live leases, fencing tokens (also of
// collected keys) and evidence. Runs only when the fixture can reopen.
func reopenKeepsState(e *env) {
	if e.f.Reopen == nil {
		e.t.Log("backend has no Reopen: persistence across reopen is not checked")
		return
	}
	// k1: failed, then pending under agent-b, plus evidence; k2: succeeded with a result;
	// k3: succeeded, then collected.
	k1 := e.call("reopen:1")
	k3 := call{ns: k1.ns + "-gc", task: "t", op: "o", target: "gc"}
	r3 := e.acquire(k3.reserve("agent-a", "digest-1"))
	e.commit(k3.commit("agent-a", r3.Lease.Token, residual.Succeeded))
	e.advance(time.Minute)
	res, err := e.l.GC(e.ctx, ledger.GCParams{Namespace: k3.ns, Before: e.now()})
	require.NoError(e.t, err)
	require.Equal(e.t, 1, res.Deleted)

	a := e.acquire(k1.reserve("agent-a", "digest-1"))
	e.commit(k1.commit("agent-a", a.Lease.Token, residual.Failed))
	b := e.acquire(k1.reserve("agent-b", "digest-1"))
	stale := k1.commit("agent-a", a.Lease.Token, residual.Succeeded)
	stale.Result = []byte(`"late"`)
	_, err = e.l.Commit(e.ctx, stale)
	requireErr(e.t, err, residual.ErrLeaseLost)

	k2 := e.call("reopen:2")
	r2 := e.acquire(k2.reserve("agent-a", "digest-1"))
	p2 := k2.commit("agent-a", r2.Lease.Token, residual.Succeeded)
	p2.Result = []byte(`{"id":2}`)
	e.commit(p2)

	e.l = e.f.Reopen(e.t)
	require.NotNil(e.t, e.l)

	got := e.get(k1)
	require.Equal(e.t, residual.Pending, got.State, "a live lease survives reopen")
	require.Equal(e.t, b.Lease.Token, got.Token)
	require.Len(e.t, got.Attempts, 2)
	requireEvidence(e, got, stale)
	inProgress := e.reserve(k1.reserve("agent-c", "digest-1"))
	require.Equal(e.t, ledger.InProgress, inProgress.Decision)
	require.Equal(e.t, residual.Succeeded, e.commit(k1.commit("agent-b", b.Lease.Token, residual.Succeeded)).State)

	replay := e.reserve(k2.reserve("agent-c", "digest-1"))
	require.Equal(e.t, ledger.Replay, replay.Decision)
	require.Equal(e.t, p2.Result, replay.Residual.Result)

	next := e.acquire(k3.reserve("agent-c", "digest-1"))
	require.Greater(e.t, next.Lease.Token, r3.Lease.Token, "the token counter of a collected key survives reopen")
}

// A ledger that implements ledger.Watcher delivers each write of the watched namespace,
// every namespace to an unfiltered watch, and closes the channel when ctx ends.
func watchDeliversChanges(e *env) {
	w, ok := e.l.(ledger.Watcher)
	if !ok {
		e.t.Log("backend does not implement ledger.Watcher")
		return
	}
	c := e.call("watch:1")
	other := call{ns: c.ns + "-other", task: c.task, op: c.op, target: c.target}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	ch, err := w.Watch(ctx, c.ns)
	require.NoError(e.t, err)
	all, err := w.Watch(ctx, "")
	require.NoError(e.t, err)

	e.acquire(other.reserve("agent-a", "digest-1"))
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	e.commit(c.commit("agent-a", a.Lease.Token, residual.Succeeded))

	want := []ledger.Change{
		{Namespace: c.ns, Key: c.key(), State: residual.Pending},
		{Namespace: c.ns, Key: c.key(), State: residual.Succeeded},
	}
	for _, w := range want {
		require.Equal(e.t, w, receive(e, ch), "the namespace watch sees only its namespace, in order")
	}
	require.Equal(e.t, ledger.Change{Namespace: other.ns, Key: other.key(), State: residual.Pending}, receive(e, all))
	for _, w := range want {
		require.Equal(e.t, w, receive(e, all))
	}

	cancel()
	requireClosed(e, ch)
	requireClosed(e, all)
}

// requireClosed drains ch and fails the case unless the ledger closes it within 10 s.
func requireClosed(e *env, ch <-chan ledger.Change) {
	e.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			e.t.Fatal("watch channel not closed within 10s of its context ending")
		}
	}
}

// receive waits for one change, failing the case after 10 s.
func receive(e *env, ch <-chan ledger.Change) ledger.Change {
	e.t.Helper()
	select {
	case c, ok := <-ch:
		require.True(e.t, ok, "watch channel closed early")
		return c
	case <-time.After(10 * time.Second):
		e.t.Fatal("no change delivered within 10s")
		return ledger.Change{}
	}
}
