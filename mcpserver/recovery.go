package mcpserver

import (
	"fmt"
	"time"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
)

// Recovery texts for MCP agents: what to do next, naming this server's tools.
var recoveries = map[interceptor.Kind]string{
	interceptor.InProgress: "another holder's lease is live and its call may be in flight; do not perform the call: " +
		"call begin_call again after retry_after_ms (the key then replays, is free, or reads as unknown)",
	interceptor.UnknownOutcome: "a previous attempt may have reached upstream and nobody recorded what happened; do not perform the call: " +
		"call reconcile with the key (probes ask upstream), or check upstream yourself and call resolve_residual as succeeded or failed",
	interceptor.AwaitingUpstream: "upstream accepted the call but has not finished it; it is not a success yet: poll the handle, " +
		"then resolve_residual (or reconcile, which probes upstream)",
	interceptor.PayloadMismatch: "this (task, operation, target) already succeeded with different arguments; the first result stands: " +
		"use it, or use another target or task for a genuinely new operation",
	interceptor.LeasePreempted: "the lease was lost before the outcome was committed; what you reported was kept as evidence only: " +
		"do not retry, the key belongs to a successor or awaits reconciliation (inspect_residual shows it)",
	interceptor.MarginTooSmall: recoveryMarginTooSmall,
}

const (
	recoveryMarginTooSmall = "too little lease time was left to dispatch safely; do not perform the call: the attempt is recorded as " +
		"failed (not dispatched); call begin_call again with a longer lease_ms"
	recoveryRenewLost = "the lease can no longer be renewed (expired, preempted or stale token); stop the call if you can and " +
		"commit_call what you observed (it is kept as evidence); do not retry"
)

// recoveryFor says what a reader of residual r should do at now.
func recoveryFor(r *residual.Residual, now time.Time) string {
	switch r.State {
	case residual.Pending:
		a := r.Current()
		if a == nil {
			return "in flight; wait"
		}
		return fmt.Sprintf("in flight under a live lease held by %s until %s (%v from now); do not act on it: wait for it to "+
			"commit or expire (it then reads as unknown)", a.Holder, a.LeaseExpires.UTC().Format(time.RFC3339Nano),
			max(a.LeaseExpires.Sub(now), 0).Round(time.Millisecond))
	case residual.Unknown:
		return recoveries[interceptor.UnknownOutcome]
	case residual.Accepted:
		if r.Handle != "" {
			return fmt.Sprintf("upstream accepted the call (handle %q) but has not finished it; poll the handle, "+
				"then resolve_residual (or reconcile, which probes upstream)", r.Handle)
		}
		return recoveries[interceptor.AwaitingUpstream]
	case residual.Succeeded:
		return "settled: begin_call with the same arguments replays the cached result"
	case residual.Failed:
		return "settled with no effect: begin_call starts a new attempt"
	}
	return "state " + r.State.String()
}
