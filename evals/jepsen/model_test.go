package jepsen

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/residual"
)

// hist builds a history by hand: times in ms from t0, the ledger's clock equal to the wall
// clock (as for PostgreSQL on this host).
type hist struct {
	ops []*Op
	n   int64
}

const t0 = int64(1_700_000_000_000_000_000)

func ms(x float64) int64 { return t0 + int64(x*1e6) }

func (h *hist) add(client int, call, ret float64, in Input, out Output) {
	h.n++
	op := &Op{ID: h.n, Client: client, In: in, Out: &out, Call: ms(call), Return: ms(ret)}
	if out.Result == RIndeterminate {
		op.Return = 0
	}
	h.ops = append(h.ops, op)
}

func (h *hist) check(t *testing.T) *Verdict {
	t.Helper()
	return Check(h.ops, time.Minute, "")
}

// acquired adds client 0's Reserve of key k acquiring token at 1 ms with a lease of ttl ms.
func (h *hist) acquired(k string, token uint64, attempts int, ttl float64) {
	h.add(0, 0, 2, Input{Kind: KReserve, Key: k, Holder: "h", Digest: "a", TTL: time.Duration(ttl * 1e6)},
		Output{Result: ROK, Decision: "acquired", HasRes: true, State: residual.Pending, Token: token, Holder: "h",
			Attempts: attempts, Started: ms(1), Expires: ms(1 + ttl)})
}

func res(state residual.State, token uint64, attempts int) Output {
	return Output{Result: ROK, HasRes: true, State: state, Token: token, Holder: "h", Attempts: attempts}
}

func commit(outcome residual.State) Input {
	return Input{Kind: KCommit, Key: "k", Holder: "h", Token: 1, Outcome: outcome, Margin: 10 * time.Millisecond}
}

// TestModelIndeterminateMayOrMayNotHappen: an indeterminate commit may have landed or not;
// a commit the ledger said did not happen must not show up later.
func TestModelIndeterminateMayOrMayNotHappen(t *testing.T) {
	for _, tc := range []struct {
		name   string
		commit Result
		seen   residual.State
		ok     bool
	}{
		{"indeterminate, landed", RIndeterminate, residual.Succeeded, true},
		{"indeterminate, not landed", RIndeterminate, residual.Pending, true},
		{"failed, not landed", RFail, residual.Pending, true},
		{"failed, yet landed", RFail, residual.Succeeded, false},
		{"ok, then lost", ROK, residual.Pending, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h hist
			h.acquired("k", 1, 1, 1000)
			out := Output{Result: tc.commit}
			if tc.commit == ROK {
				out = res(residual.Succeeded, 1, 1)
			}
			h.add(0, 10, 20, commit(residual.Succeeded), out)
			h.add(1, 30, 31, Input{Kind: KGet, Key: "k"}, res(tc.seen, 1, 1))
			require.Equal(t, tc.ok, h.check(t).Linearizable == "Ok")
		})
	}
}

// TestModelJudgesExpiryOnTheLedgerClock: a read wholly after the lease's expiry must see
// unknown; one that overlaps it may see either; a commit after the expiry less the margin
// must be refused.
func TestModelJudgesExpiryOnTheLedgerClock(t *testing.T) {
	for _, tc := range []struct {
		name      string
		call, ret float64
		seen      residual.State
		ok        bool
	}{
		{"before expiry, pending", 50, 60, residual.Pending, true},
		{"before expiry, unknown", 50, 60, residual.Unknown, false},
		{"after expiry, unknown", 150, 160, residual.Unknown, true},
		{"after expiry, pending", 150, 160, residual.Pending, false},
		{"across expiry, pending", 95, 105, residual.Pending, true},
		{"across expiry, unknown", 95, 105, residual.Unknown, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h hist
			h.acquired("k", 1, 1, 100) // expires at 101 ms
			h.add(1, tc.call, tc.ret, Input{Kind: KGet, Key: "k"}, res(tc.seen, 1, 1))
			require.Equal(t, tc.ok, h.check(t).Linearizable == "Ok")
		})
	}
	var h hist
	h.acquired("k", 1, 1, 100)
	h.add(0, 95, 96, commit(residual.Succeeded), res(residual.Succeeded, 1, 1)) // 5 ms left, margin 10 ms
	require.Equal(t, "Illegal", h.check(t).Linearizable, "a commit inside the margin must have been refused")
}

// TestModelGCKeepsTokens: after GC deletes a settled key, the next reservation gets the
// next token; a repeated token is illegal and an invariant violation.
func TestModelGCKeepsTokens(t *testing.T) {
	for _, tc := range []struct {
		token uint64
		ok    bool
	}{{2, true}, {1, false}} {
		var h hist
		h.acquired("k", 1, 1, 1000)
		h.add(0, 10, 11, commit(residual.Failed), res(residual.Failed, 1, 1))
		h.add(2, 20, 30, Input{Kind: KGC}, Output{Result: ROK})
		h.add(1, 40, 41, Input{Kind: KGet, Key: "k"}, Output{Result: RNotFound})
		h.add(1, 50, 52, Input{Kind: KReserve, Key: "k", Holder: "h", Digest: "a", TTL: time.Second},
			Output{Result: ROK, Decision: "acquired", HasRes: true, State: residual.Pending, Token: tc.token, Holder: "h",
				Attempts: 1, Started: ms(51), Expires: ms(1051)})
		v := h.check(t)
		require.Equal(t, tc.ok, v.OK(), "token %d: %s %v", tc.token, v, v.Violations)
		if !tc.ok {
			require.Contains(t, joined(v.Violations), "issued twice")
		}
	}
}

// TestInvariantUnknownNeverTurnsSucceeded: a reader that saw unknown must not later see
// succeeded under the same token without a resolution.
func TestInvariantUnknownNeverTurnsSucceeded(t *testing.T) {
	var h hist
	h.acquired("k", 1, 1, 100)
	h.add(1, 150, 151, Input{Kind: KGet, Key: "k"}, res(residual.Unknown, 1, 1))
	h.add(1, 160, 161, Input{Kind: KGet, Key: "k"}, res(residual.Succeeded, 1, 1))
	v := h.check(t)
	require.Equal(t, "Illegal", v.Linearizable)
	require.Contains(t, joined(v.Violations), "unknown became succeeded without a resolution")
}

// TestInvariantsOfFencing: two overlapping live leases, and a commit under a token older
// than one already acknowledged, are violations.
func TestInvariantsOfFencing(t *testing.T) {
	var h hist
	h.acquired("k", 1, 1, 100) // live until 101 ms
	h.add(1, 40, 60, Input{Kind: KReserve, Key: "k", Holder: "h2", Digest: "a", TTL: 100 * time.Millisecond},
		Output{Result: ROK, Decision: "acquired", HasRes: true, State: residual.Pending, Token: 2, Holder: "h2",
			Attempts: 2, Started: ms(50), Expires: ms(150)})
	late := res(residual.Succeeded, 1, 1)
	late.Ended = ms(75)
	h.add(0, 70, 80, commit(residual.Succeeded), late)
	v := h.check(t)
	require.Equal(t, "Illegal", v.Linearizable)
	all := joined(v.Violations)
	require.Contains(t, all, "two live leases on k")
	require.Contains(t, all, "commit under stale token 1 on k")
}

// TestModelCommitAnswersWithALaterRead: a Commit is answered with the residual as stored
// when the answer is read, which for a Commit retried after a lost reply is after other
// steps landed (e19k1 in docs/reliability.md: two observations appended after the commit,
// counted in its answer). That answer is legal; one that no state after the commit
// explains (the evidence never appended, or the key still pending) is not.
func TestModelCommitAnswersWithALaterRead(t *testing.T) {
	for _, tc := range []struct {
		name     string
		evidence int
		state    residual.State
		ok       bool
	}{
		{"as the commit left it", 0, residual.Succeeded, true},
		{"with the observations appended after it", 2, residual.Succeeded, true},
		{"with observations never appended", 3, residual.Succeeded, false},
		{"still pending", 0, residual.Pending, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h hist
			h.acquired("k", 1, 1, 1000)
			h.add(1, 9, 10, Input{Kind: KGet, Key: "k"}, res(residual.Pending, 1, 1))
			h.add(1, 30, 31, Input{Kind: KGet, Key: "k"}, res(residual.Succeeded, 1, 1)) // the commit landed by now
			h.add(1, 40, 41, Input{Kind: KEvidence, Key: "k"}, Output{Result: ROK, HasRes: true, State: residual.Succeeded, Token: 1, Holder: "h", Attempts: 1, Evidence: 1})
			h.add(1, 50, 51, Input{Kind: KEvidence, Key: "k"}, Output{Result: ROK, HasRes: true, State: residual.Succeeded, Token: 1, Holder: "h", Attempts: 1, Evidence: 2})
			out := res(tc.state, 1, 1)
			out.Evidence = tc.evidence
			h.add(0, 20, 60, commit(residual.Succeeded), out)
			require.Equal(t, tc.ok, h.check(t).Linearizable == "Ok")
		})
	}
}

// TestModelRefusedCommitAnswersWithALaterRead: a Commit refused (lease lost) and recorded as
// evidence is retried like any write whose reply was lost, and answered with the residual
// as the retry reads it, after other steps landed (a TestJepsenPostgres run of 2026-12-07:
// its answer held the later reservation's token). That answer is legal; one that no state
// after the refusal explains is not.
func TestModelRefusedCommitAnswersWithALaterRead(t *testing.T) {
	for _, tc := range []struct {
		name     string
		evidence int
		ok       bool
	}{
		{"as the refusal left it", 1, true},
		{"with an observation appended after it", 2, true},
		{"without its own observation", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h hist
			h.acquired("k", 1, 1, 5) // expires at 6 ms
			h.add(1, 9, 10, Input{Kind: KGet, Key: "k"}, Output{Result: ROK, HasRes: true, State: residual.Unknown, Token: 1, Holder: "h", Attempts: 1})
			h.add(1, 40, 41, Input{Kind: KGet, Key: "k"}, Output{Result: ROK, HasRes: true, State: residual.Unknown, Token: 1, Holder: "h", Attempts: 1, Evidence: 1}) // the refusal landed by now
			h.add(1, 50, 51, Input{Kind: KEvidence, Key: "k"}, Output{Result: ROK, HasRes: true, State: residual.Unknown, Token: 1, Holder: "h", Attempts: 1, Evidence: 2})
			out := Output{Result: RLeaseLost, HasRes: true, State: residual.Unknown, Token: 1, Holder: "h", Attempts: 1, Evidence: tc.evidence}
			h.add(0, 20, 60, commit(residual.Succeeded), out)
			require.Equal(t, tc.ok, h.check(t).Linearizable == "Ok")
		})
	}
}

// TestModelLostRenewMayHaveExtended: a renew answered lease_lost may still have extended
// the lease, when its first try landed and the retry read the key after the extended lease
// ran out (PostgreSQL after a broken connection): a read that saw the lease live past its
// first expiry is then legal. It is not when the renew's answer came before the extension
// could have run out, nor when the renew started after the lease had expired.
func TestModelLostRenewMayHaveExtended(t *testing.T) {
	for _, tc := range []struct {
		name               string
		renewCall, renewAt float64
		ok                 bool
	}{
		{"the extension ran out before the answer", 2, 60, true},
		{"the answer came before the extension could run out", 2, 10, false},
		{"the renew started after the lease ran out", 7, 60, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h hist
			h.acquired("k", 1, 1, 5) // expires at 6 ms
			h.add(1, 8, 9, Input{Kind: KGet, Key: "k"}, res(residual.Pending, 1, 1))
			h.add(0, tc.renewCall, tc.renewAt, Input{Kind: KRenew, Key: "k", Holder: "h", Token: 1, TTL: 20 * time.Millisecond},
				Output{Result: RLeaseLost})
			require.Equal(t, tc.ok, h.check(t).Linearizable == "Ok")
		})
	}
}
