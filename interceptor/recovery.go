package interceptor

import (
	"fmt"
	"time"

	"github.com/toolfence/toolfence/residual"
)

// The recovery texts: what to do next, one per violation kind, for every surface (Go, MCP,
// HTTP, the CLI). They name each surface's way to reconcile and resolve.
var recoveries = map[Kind]string{
	InProgress: "another attempt holds the lease and may be in flight; do not dispatch again: " +
		"retry after the lease expires (the key then replays, is free, or reads as unknown)",
	UnknownOutcome: "a previous attempt may have reached upstream and its outcome was never recorded; do not retry: " +
		"reconcile first (a probe asks upstream: MCP reconcile), or check upstream yourself and resolve the key as succeeded " +
		"or failed (MCP resolve_residual, or `toolfence resolve KEY --as succeeded|failed`)",
	AwaitingUpstream: "upstream accepted the call but has not finished it; it is not a success yet: poll the handle, " +
		"then resolve the key (a probe does it automatically: MCP reconcile)",
	PayloadMismatch: "this (task, operation, target) already succeeded with different arguments; the first result stands: " +
		"use it, or use another target or task for a genuinely new operation",
	LeaseLost: "the lease was lost before the outcome was committed; the outcome was kept as evidence for reconcilers: " +
		"do not retry, the key belongs to a successor or awaits reconciliation (MCP inspect_residual, `toolfence show KEY`)",
	MarginTooSmall: "too little lease time was left to dispatch safely; do not perform the call: nothing was sent and the " +
		"attempt is recorded as failed (not dispatched); retry with a longer lease (MCP: a longer lease_ms)",
}

// recoveryRenewLost is the recovery of a LeaseLost violation raised by a renewal.
const recoveryRenewLost = "the lease can no longer be renewed (expired, preempted or stale token); stop the call if you can " +
	"and commit what you observed (it is kept as evidence); do not retry"

// Recovery returns the recovery text of a violation kind ("" for an unknown kind).
func Recovery(k Kind) string { return recoveries[k] }

// RecoveryFor says, in a sentence, what a reader of residual r should do at now (r's
// effective state is judged at now).
func RecoveryFor(r *residual.Residual, now time.Time) string {
	switch r.EffectiveState(now) {
	case residual.Pending:
		a := r.Current()
		if a == nil {
			return "in flight; wait"
		}
		return fmt.Sprintf("in flight under a live lease held by %s until %s (%v from now); do not act on it: wait for it to "+
			"commit or expire (it then reads as unknown)", a.Holder, a.LeaseExpires.UTC().Format(time.RFC3339Nano),
			max(a.LeaseExpires.Sub(now), 0).Round(time.Millisecond))
	case residual.Unknown:
		return recoveries[UnknownOutcome]
	case residual.Accepted:
		if r.Handle != "" {
			return fmt.Sprintf("upstream accepted the call (handle %q) but has not finished it; it is not a success yet: "+
				"poll the handle, then resolve the key (a probe does it automatically: MCP reconcile)", r.Handle)
		}
		return recoveries[AwaitingUpstream]
	case residual.Succeeded:
		return "settled: a call with the same arguments replays the cached result"
	case residual.Failed:
		return "settled with no effect: a new call starts a new attempt"
	}
	return "state " + r.State.String()
}
