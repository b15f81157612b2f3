package ledgertest

import (
	"fmt"
	"slices"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

var listCases = []testCase{
	{"ListFiltersByEffectiveState", listFiltersByEffectiveState},
	{"ListFiltersByTaskOperationTarget", listFiltersByTaskOperationTarget},
	{"ListPagesInKeyOrder", listPagesInKeyOrder},
	{"ListFilteredPages", listFilteredPages},
	{"NamespacesIsolated", namespacesIsolated},
	{"GCRemovesOnlyOldSettled", gcRemovesOnlyOldSettled},
	{"GCKeepsTokensGrowing", gcKeepsTokensGrowing},
}

// states creates one residual in each state under e's namespace and returns their calls by
// state. The unknown one is a pending whose short lease has expired; the clock has moved
// by 2*shortTTL when it returns.
func (e *env) states() map[residual.State]call {
	const shortTTL = 10 * time.Second
	out := map[residual.State]call{}
	for _, s := range residual.States {
		c := e.call("state:" + string(s))
		p := c.reserve("agent-a", "digest-1")
		p.TTL = time.Hour
		if s == residual.Unknown {
			p.TTL = shortTTL
		}
		a := e.acquire(p)
		if s.Terminal() || s == residual.Accepted {
			e.commit(c.commit("agent-a", a.Lease.Token, s))
		}
		out[s] = c
	}
	e.advance(2 * shortTTL)
	return out
}

// List filters on the effective state: an expired pending is listed as unknown only.
func listFiltersByEffectiveState(e *env) {
	byState := e.states()
	ns := byState[residual.Pending].ns

	for _, s := range residual.States {
		got := e.list(ledger.ListParams{Namespace: ns, States: []residual.State{s}})
		require.Equal(e.t, []string{byState[s].key()}, keys(got), "state %s", s)
		require.Equal(e.t, s, got[0].State)
	}
	open := e.list(ledger.ListParams{Namespace: ns, States: []residual.State{residual.Unknown, residual.Accepted}})
	want := []string{byState[residual.Unknown].key(), byState[residual.Accepted].key()}
	slices.Sort(want)
	require.Equal(e.t, want, keys(open))

	all := e.list(ledger.ListParams{Namespace: ns})
	require.Len(e.t, all, len(residual.States))
}

// List filters by task, operation and target, all filters applying at once.
func listFiltersByTaskOperationTarget(e *env) {
	ns := "ns-" + e.t.Name()
	calls := []call{
		{ns, "task-1", "email.send", "email:a"},
		{ns, "task-1", "email.send", "email:b"},
		{ns, "task-1", "charge.create", "email:a"},
		{ns, "task-2", "email.send", "email:a"},
	}
	for _, c := range calls {
		e.acquire(c.reserve("agent-a", "digest-1"))
	}
	sorted := func(cs ...call) []string {
		out := make([]string, 0, len(cs))
		for _, c := range cs {
			out = append(out, c.key())
		}
		slices.Sort(out)
		return out
	}
	cases := []struct {
		p    ledger.ListParams
		want []string
	}{
		{ledger.ListParams{Task: "task-1"}, sorted(calls[0], calls[1], calls[2])},
		{ledger.ListParams{Task: "task-2"}, sorted(calls[3])},
		{ledger.ListParams{Operation: "email.send"}, sorted(calls[0], calls[1], calls[3])},
		{ledger.ListParams{Target: "email:a"}, sorted(calls[0], calls[2], calls[3])},
		{ledger.ListParams{Task: "task-1", Operation: "email.send", Target: "email:a"}, sorted(calls[0])},
		{ledger.ListParams{Task: "task-3"}, []string{}},
	}
	for _, tc := range cases {
		tc.p.Namespace = ns
		require.Equal(e.t, tc.want, keys(e.list(tc.p)), "filter %+v", tc.p)
	}
}

// Paging with Limit and Cursor visits every residual exactly once, in key order, and the
// last page has no cursor.
func listPagesInKeyOrder(e *env) {
	var want []string
	var ns string
	for i := range 7 {
		c := e.call(fmt.Sprintf("item:%d", i))
		ns = c.ns
		e.acquire(c.reserve("agent-a", "digest-1"))
		want = append(want, c.key())
	}
	slices.Sort(want)

	var got []string
	p := ledger.ListParams{Namespace: ns, Limit: 3}
	var sizes []int
	for range 10 {
		page, err := e.l.List(e.ctx, p)
		require.NoError(e.t, err)
		sizes = append(sizes, len(page.Residuals))
		got = append(got, keys(page.Residuals)...)
		if page.NextCursor == "" {
			break
		}
		p.Cursor = page.NextCursor
	}
	require.Equal(e.t, []int{3, 3, 1}, sizes)
	require.Equal(e.t, want, got, "every residual once, in key order")

	// A page that holds exactly the rest says it is the last.
	page, err := e.l.List(e.ctx, ledger.ListParams{Namespace: ns, Limit: 7})
	require.NoError(e.t, err)
	require.Len(e.t, page.Residuals, 7)
	require.Empty(e.t, page.NextCursor)

	// Filters and paging combine: the filter applies before the limit.
	e.advance(pastTTL)
	first := e.call("item:first")
	e.acquire(first.reserve("agent-a", "digest-1")) // the only live pending
	page, err = e.l.List(e.ctx, ledger.ListParams{Namespace: ns, Limit: 1, States: []residual.State{residual.Pending}})
	require.NoError(e.t, err)
	require.Equal(e.t, []string{first.key()}, keys(page.Residuals))
	require.Empty(e.t, page.NextCursor)
}

// Namespaces are isolated: the same key in two namespaces are two residuals with their
// own tokens, and neither namespace sees the other's.
func namespacesIsolated(e *env) {
	a := e.call("invoice:INV-1")
	b := call{ns: a.ns + "-other", task: a.task, op: a.op, target: a.target}
	ra := e.acquire(a.reserve("agent-a", "digest-1"))
	e.commit(a.commit("agent-a", ra.Lease.Token, residual.Failed))
	e.acquire(a.reserve("agent-a", "digest-1")) // token 2 in namespace A

	pb := a.reserve("agent-b", "digest-1")
	pb.Namespace = b.ns // A's key in namespace B: a key names its namespace
	_, err := e.l.Reserve(e.ctx, pb)
	requireErr(e.t, err, ledger.ErrInvalidParams, "a key is derived from its namespace, task, operation and target")
	_, err = e.l.Get(e.ctx, ledger.GetParams{Namespace: b.ns, Key: a.key()})
	requireErr(e.t, err, residual.ErrNotFound, "namespace B does not see A's residual")
	pb = b.reserve("agent-b", "digest-1")
	page, err := e.l.List(e.ctx, ledger.ListParams{Namespace: b.ns})
	require.NoError(e.t, err)
	require.Empty(e.t, page.Residuals)

	rb := e.acquire(pb)
	require.Equal(e.t, uint64(1), rb.Lease.Token, "tokens are per namespace and key")
	require.Equal(e.t, b.ns, rb.Residual.Namespace)

	la := e.list(ledger.ListParams{Namespace: a.ns})
	lb := e.list(ledger.ListParams{Namespace: b.ns})
	require.Len(e.t, la, 1)
	require.Len(e.t, lb, 1)
	require.Equal(e.t, a.ns, la[0].Namespace)
	require.Equal(e.t, uint64(2), la[0].Token)
	require.Equal(e.t, b.ns, lb[0].Namespace)
	require.Equal(e.t, "agent-b", lb[0].Current().Holder)
}

// GC deletes settled residuals last updated before Before, and never open ones however old.
func gcRemovesOnlyOldSettled(e *env) {
	byState := e.states()
	ns := byState[residual.Pending].ns
	e.advance(time.Hour) // the pending one expires too: it is unknown now, still kept
	fresh := e.call("state:fresh")
	fa := e.acquire(fresh.reserve("agent-a", "digest-1"))
	e.commit(fresh.commit("agent-a", fa.Lease.Token, residual.Succeeded))
	e.advance(time.Minute)

	res, err := e.l.GC(e.ctx, ledger.GCParams{Namespace: ns, Before: e.now().Add(-2 * time.Minute)})
	require.NoError(e.t, err)
	require.Equal(e.t, 2, res.Deleted, "the old succeeded and failed residuals")

	for _, s := range []residual.State{residual.Succeeded, residual.Failed} {
		_, err := e.l.Get(e.ctx, byState[s].get())
		requireErr(e.t, err, residual.ErrNotFound, "old %s residual is collected", s)
	}
	for _, s := range []residual.State{residual.Pending, residual.Unknown, residual.Accepted} {
		r := e.get(byState[s])
		require.True(e.t, r.State.Open(), "%s residual is never collected", s)
	}
	require.Equal(e.t, residual.Succeeded, e.get(fresh).State, "a settled residual newer than Before is kept")

	// Nothing left to collect in this namespace; another namespace is untouched.
	other := call{ns: ns + "-other", task: "t", op: "o", target: "x"}
	oa := e.acquire(other.reserve("agent-a", "digest-1"))
	e.commit(other.commit("agent-a", oa.Lease.Token, residual.Failed))
	e.advance(time.Minute)
	res, err = e.l.GC(e.ctx, ledger.GCParams{Namespace: ns, Before: e.now()})
	require.NoError(e.t, err)
	require.Equal(e.t, 1, res.Deleted, "only the fresh one of this namespace")
	require.Equal(e.t, residual.Failed, e.get(other).State)

	// An empty namespace collects every namespace.
	res, err = e.l.GC(e.ctx, ledger.GCParams{Before: e.now()})
	require.NoError(e.t, err)
	require.Equal(e.t, 1, res.Deleted)
	_, err = e.l.Get(e.ctx, other.get())
	requireErr(e.t, err, residual.ErrNotFound)
}

// A key reserved again after GC gets a higher token than any issued before GC.
func gcKeepsTokensGrowing(e *env) {
	c := e.call("charge:cus_20")
	a := e.acquire(c.reserve("agent-a", "digest-1"))
	e.commit(c.commit("agent-a", a.Lease.Token, residual.Failed))
	b := e.acquire(c.reserve("agent-b", "digest-1"))
	e.commit(c.commit("agent-b", b.Lease.Token, residual.Succeeded))
	require.Equal(e.t, uint64(2), b.Lease.Token)
	e.advance(time.Hour)

	res, err := e.l.GC(e.ctx, ledger.GCParams{Namespace: c.ns, Before: e.now()})
	require.NoError(e.t, err)
	require.Equal(e.t, 1, res.Deleted)
	_, err = e.l.Get(e.ctx, c.get())
	requireErr(e.t, err, residual.ErrNotFound)

	next := e.acquire(c.reserve("agent-c", "digest-9"))
	require.Greater(e.t, next.Lease.Token, b.Lease.Token, "GC never resets a fencing token")
	require.Len(e.t, next.Residual.Attempts, 1, "the collected history is gone")
	require.Equal(e.t, 1, next.Residual.Attempts[0].N)

	// The collected holder's commit is refused, not resurrected.
	_, err = e.l.Commit(e.ctx, c.commit("agent-b", b.Lease.Token, residual.Succeeded))
	requireErr(e.t, err, residual.ErrLeaseLost)
}

// Filtered listings page like unfiltered ones (backends answer them from indexes, so a
// filter that matches nothing reads nothing): for each combination of task, operation, target and states, pages of two visit
// every match exactly once in key order, every page but the last is full and only the last
// has no cursor; a filter that matches nothing answers one empty last page. A residual that
// leaves the filter between two pages (the cursor's own, settled meanwhile) does not stop
// the listing, and one collected by GC is no longer listed.
func listFilteredPages(e *env) {
	ns := "ns-" + e.t.Name()
	type made struct {
		c     call
		state residual.State
	}
	var all []made
	n := 0
	for _, task := range []string{"task-a", "task-b"} {
		for _, op := range []string{"op-1", "op-2"} {
			for _, st := range []residual.State{residual.Pending, residual.Succeeded, residual.Failed, residual.Accepted, residual.Unknown} {
				n++
				c := call{ns: ns, task: task, op: op, target: fmt.Sprintf("item:%d", n%7)}
				p := c.reserve("agent-a", "digest-1")
				if st == residual.Unknown {
					p.TTL = time.Second // expires below: an unknown residual
				} else {
					p.TTL = time.Hour
				}
				a := e.acquire(p)
				if st.Terminal() || st == residual.Accepted {
					e.commit(c.commit("agent-a", a.Lease.Token, st))
				}
				all = append(all, made{c, st})
			}
		}
	}
	e.advance(time.Minute)
	open := []residual.State{residual.Pending, residual.Unknown, residual.Accepted}
	want := func(p ledger.ListParams) []string {
		out := []string{}
		for _, m := range all {
			if p.Task != "" && m.c.task != p.Task || p.Operation != "" && m.c.op != p.Operation ||
				p.Target != "" && m.c.target != p.Target || len(p.States) > 0 && !slices.Contains(p.States, m.state) {
				continue
			}
			out = append(out, m.c.key())
		}
		slices.Sort(out)
		return out
	}
	// pages lists p in pages of two and checks their shape.
	pages := func(p ledger.ListParams) []string {
		p.Namespace, p.Limit = ns, 2
		got := []string{}
		for i := 0; ; i++ {
			require.Less(e.t, i, 100, "filter %+v: the listing does not end", p)
			page, err := e.l.List(e.ctx, p)
			require.NoError(e.t, err, "filter %+v", p)
			got = append(got, keys(page.Residuals)...)
			for _, r := range page.Residuals {
				require.Equal(e.t, ns, r.Namespace)
				if len(p.States) > 0 {
					require.Contains(e.t, p.States, r.State, "filter %+v: %s", p, r.Key)
				}
			}
			if page.NextCursor == "" {
				return got
			}
			require.Len(e.t, page.Residuals, 2, "filter %+v: a page with a cursor is full", p)
			require.Equal(e.t, page.Residuals[1].Key, page.NextCursor)
			p.Cursor = page.NextCursor
		}
	}
	for _, p := range []ledger.ListParams{
		{},
		{Task: "task-a"},
		{Operation: "op-2"},
		{Target: "item:3"},
		{Task: "task-b", Operation: "op-1"},
		{Task: "task-a", Target: "item:1"},
		{Task: "task-a", Operation: "op-1", Target: "item:1"},
		{States: open},
		{States: []residual.State{residual.Unknown}},
		{States: []residual.State{residual.Pending}},
		{States: []residual.State{residual.Succeeded, residual.Failed}},
		{Task: "task-b", States: open},
		{Operation: "op-1", States: []residual.State{residual.Accepted}},
		{Target: "item:2", States: []residual.State{residual.Succeeded}},
		{Task: "task-none", States: open},
		{Task: "task-a", Operation: "op-none"},
		{Target: "item:none"},
	} {
		require.Equal(e.t, want(p), pages(p), "filter %+v", p)
	}

	// A filter that matches nothing answers one empty page that says it is the last.
	page, err := e.l.List(e.ctx, ledger.ListParams{Namespace: ns, Task: "task-none", States: open})
	require.NoError(e.t, err)
	require.Empty(e.t, page.Residuals)
	require.Empty(e.t, page.NextCursor)

	// The cursor's residual settles between two pages: the listing goes on after it.
	p := ledger.ListParams{Namespace: ns, Task: "task-a", States: []residual.State{residual.Pending}, Limit: 1}
	first, err := e.l.List(e.ctx, p)
	require.NoError(e.t, err)
	require.Len(e.t, first.Residuals, 1)
	require.NotEmpty(e.t, first.NextCursor)
	cur := first.Residuals[0]
	e.commit(ledger.CommitParams{Namespace: ns, Key: cur.Key, Holder: "agent-a", Token: cur.Token,
		Outcome: residual.Failed, Margin: margin})
	p.Cursor, p.Limit = first.NextCursor, 10
	rest, err := e.l.List(e.ctx, p)
	require.NoError(e.t, err)
	pendingA := want(ledger.ListParams{Task: "task-a", States: []residual.State{residual.Pending}})
	require.Equal(e.t, pendingA[1:], keys(rest.Residuals))
	require.Empty(e.t, rest.NextCursor)
	require.NotContains(e.t, keys(e.list(ledger.ListParams{Namespace: ns, States: open})), cur.Key,
		"a settled residual leaves the open listing")
	require.Contains(e.t, keys(e.list(ledger.ListParams{Namespace: ns, Task: "task-a", States: []residual.State{residual.Failed}})), cur.Key)

	// GC: collected residuals are no longer listed under any filter.
	e.advance(time.Hour)
	_, err = e.l.GC(e.ctx, ledger.GCParams{Namespace: ns, Before: e.now()})
	require.NoError(e.t, err)
	for _, p := range []ledger.ListParams{{Task: "task-a"}, {Operation: "op-1"}, {Target: "item:2"}, {}} {
		p.Namespace = ns
		for _, r := range e.list(p) {
			require.True(e.t, r.State.Open(), "filter %+v lists collected residual %s (%s)", p, r.Key, r.State)
		}
	}
}
