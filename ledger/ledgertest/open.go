package ledgertest

import (
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// openCases check ledger.OpenCounter, for backends that implement it.
var openCases = []testCase{
	{"open residuals are counted by effective state", func(e *env) {
		oc, ok := e.l.(ledger.OpenCounter)
		if !ok {
			e.t.Skip("the backend does not implement ledger.OpenCounter")
		}
		counts := func() map[residual.State]int64 {
			e.t.Helper()
			got, err := oc.OpenResiduals(e.ctx)
			require.NoError(e.t, err)
			require.Len(e.t, got, 3, "one count each for pending, unknown, accepted")
			m := map[residual.State]int64{}
			for _, c := range got {
				m[c.State] = c.Count
				require.Equal(e.t, c.Count == 0, c.Oldest.IsZero(), "%s: Oldest is set exactly when there is one", c.State)
			}
			return m
		}
		none := map[residual.State]int64{residual.Pending: 0, residual.Unknown: 0, residual.Accepted: 0}
		require.Equal(e.t, none, counts(), "an empty ledger")

		pending, accepted, done := e.call("pending"), e.call("accepted"), e.call("done")
		e.acquire(pending.reserve("h", "d"))
		a := e.acquire(accepted.reserve("h", "d"))
		e.commit(accepted.commit("h", a.Lease.Token, residual.Accepted))
		d := e.acquire(done.reserve("h", "d"))
		e.commit(done.commit("h", d.Lease.Token, residual.Succeeded))
		require.Equal(e.t, map[residual.State]int64{residual.Pending: 1, residual.Unknown: 0, residual.Accepted: 1}, counts(),
			"writes after the first count are seen; a succeeded residual is not open")

		e.advance(pastTTL)
		require.Equal(e.t, map[residual.State]int64{residual.Pending: 0, residual.Unknown: 1, residual.Accepted: 1}, counts(),
			"an expired pending counts as unknown")

		_, err := e.l.Resolve(e.ctx, ledger.ResolveParams{Namespace: pending.ns, Key: pending.key(), As: residual.Failed, By: "test", Note: "checked"})
		require.NoError(e.t, err)
		_, err = e.l.Resolve(e.ctx, ledger.ResolveParams{Namespace: accepted.ns, Key: accepted.key(), As: residual.Succeeded, By: "test", Note: "checked"})
		require.NoError(e.t, err)
		require.Equal(e.t, none, counts(), "resolved residuals are not open")
	}},
}
