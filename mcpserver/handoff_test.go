package mcpserver_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/testkit/crashtest"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// agentEnv carries agent A's job (JSON agentJob) to the child that plays it: it connects to
// the server named there, calls begin_call, marks "began <result JSON>" and then hangs, as
// an agent does in the middle of its side effect, until it is killed.
const agentEnv = "TOOLFENCE_MCPSERVER_TEST_AGENT"

type agentJob struct {
	URL   string         `json:"url"`
	Token string         `json:"token"`
	Begin map[string]any `json:"begin"`
}

// TestCrashChild is the child of the hand-off tests (see internal/testkit/crashtest); it returns at
// once in a normal test run.
func TestCrashChild(t *testing.T) {
	crashtest.Run(t, map[string]func(t *testing.T){"agent-a": func(t *testing.T) {
		var job agentJob
		require.NoError(t, json.Unmarshal([]byte(os.Getenv(agentEnv)), &job))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := mcpserver.Dial(ctx, job.URL, job.Token)
		require.NoError(t, err)
		var out mcpserver.BeginResult
		require.NoError(t, c.Call(ctx, "begin_call", job.Begin, &out))
		line, err := json.Marshal(out)
		require.NoError(t, err)
		crashtest.Mark("began", string(line))
		crashtest.Hang() // "performing the side effect" until SIGKILLed
	}})
}

// startAgentA runs agent A as a child process, waits for its begin_call result, then
// SIGKILLs it and reaps it.
func startAgentA(t *testing.T, e *env, begin map[string]any) mcpserver.BeginResult {
	t.Helper()
	job, err := json.Marshal(agentJob{URL: e.ts.URL, Token: tokA, Begin: begin})
	require.NoError(t, err)
	child := crashtest.Start(t, "agent-a", agentEnv+"="+string(job))
	line := child.Await("began")
	child.Kill() // crash mid-call: no commit, no cleanup
	var out mcpserver.BeginResult
	require.NoError(t, json.Unmarshal([]byte(line), &out))
	require.Equal(t, mcpserver.DecisionProceed, out.Decision)
	return out
}

// TestSuccessorHandOff: agent A (a child process) begins a call and is SIGKILLed; agent B
// sees the residual pending, then unknown once the lease expires, settles it (through a
// probe, or by hand), and its begin_call replays; A's late commit is refused.
func TestSuccessorHandOff(t *testing.T) {
	t.Parallel()
	for _, settle := range []string{"probe", "resolve"} {
		t.Run(settle, func(t *testing.T) {
			t.Parallel()
			e := setup(t, nil)
			op := "charge-card"
			if settle == "probe" {
				op = opProbed
			}
			begin := m{"task": "run-7", "operation": op, "target": "invoice:INV-42", "args": m{"amount": 4200}, "holder": "agent-A", "lease_ms": 5000}
			a := startAgentA(t, e, begin)

			b := e.dial(tokA, legacy)
			list := ok[mcpserver.ListResult](t, b, "list_pending", m{"task": "run-7"})
			require.Len(t, list.Residuals, 1)
			require.Equal(t, a.Key, list.Residuals[0].Key)
			require.Equal(t, residual.Pending, list.Residuals[0].State)
			require.Regexp(t, `^agent-A#[0-9a-f]{32}$`, list.Residuals[0].Holder)
			require.Equal(t, a.Holder, list.Residuals[0].Holder)
			require.Equal(t, a.Token, list.Residuals[0].Token)

			// B knows the token (everyone in the namespace does) but not A's lease secret:
			// it can neither settle A's live attempt nor keep it alive, and nothing is written.
			live := snapshot(t, e.led, nsA)
			wrong := strings.Repeat("ab", 16)
			require.Equal(t, mcpwire.KindInvalidInput, fails(t, b, "commit_call", m{"key": a.Key, "token": a.Token, "outcome": "failed"}).Kind)
			require.Equal(t, mcpwire.KindLeaseLost, fails(t, b, "commit_call", m{"key": a.Key, "token": a.Token, "outcome": "failed", "lease_secret": wrong}).Kind)
			require.Equal(t, mcpwire.KindInvalidInput, fails(t, b, "renew_lease", m{"key": a.Key, "token": a.Token, "lease_ms": 60000}).Kind)
			require.Equal(t, mcpwire.KindLeaseLost, fails(t, b, "renew_lease", m{"key": a.Key, "token": a.Token, "lease_ms": 60000, "lease_secret": wrong}).Kind)
			require.Equal(t, live, snapshot(t, e.led, nsA), "refused commits and renewals wrote nothing")

			delete(begin, "holder")
			blocked := ok[mcpserver.BeginResult](t, b, "begin_call", begin)
			require.Equal(t, interceptor.Kind("in_progress"), blocked.Violation.Kind)
			rec := ok[mcpserver.ReconcileResult](t, b, "reconcile", m{"task": "run-7"})
			require.Empty(t, rec.Settled, "a live lease is left alone")
			require.Contains(t, rec.Unsettled[0].Reason, "live lease")
			require.Equal(t, mcpwire.KindInProgress, fails(t, b, "resolve_residual", m{"key": a.Key, "as": "failed", "note": "too early"}).Kind)

			// A's lease runs out: the residual reads as unknown and blocks.
			e.clock.Advance(5*time.Second + time.Millisecond)
			list = ok[mcpserver.ListResult](t, b, "list_pending", m{"state": "unknown"})
			require.Len(t, list.Residuals, 1)
			require.Equal(t, a.Key, list.Residuals[0].Key)
			require.Contains(t, list.Residuals[0].Recovery, "reconcile")
			blocked = ok[mcpserver.BeginResult](t, b, "begin_call", begin)
			require.Equal(t, interceptor.Kind("unknown_outcome"), blocked.Violation.Kind)
			require.Equal(t, a.Holder, blocked.Violation.Holder)

			var settledToken uint64
			if settle == "probe" {
				rec = ok[mcpserver.ReconcileResult](t, b, "reconcile", m{"task": "run-7"})
				require.Len(t, rec.Settled, 1)
				require.Equal(t, residual.Unknown, rec.Settled[0].From)
				require.Equal(t, residual.Succeeded, rec.Settled[0].To)
				settledToken = rec.Settled[0].Token
			} else {
				rec = ok[mcpserver.ReconcileResult](t, b, "reconcile", m{"key": a.Key})
				require.Len(t, rec.Unsettled, 1)
				require.Contains(t, rec.Unsettled[0].Reason, "no probe")
				rs := ok[mcpserver.ResolveResult](t, b, "resolve_residual", m{
					"key": a.Key, "as": "succeeded", "note": "INV-42 shows as paid in the dashboard",
					"result": m{"found": "invoice:INV-42"}, "by": "agent-B",
				})
				require.Equal(t, residual.Succeeded, rs.State)
				settledToken = rs.Token
			}
			require.Greater(t, settledToken, a.Token, "settling takes a new fencing token")

			rp := ok[mcpserver.BeginResult](t, b, "begin_call", begin)
			require.Equal(t, mcpserver.DecisionReplay, rp.Decision)
			require.JSONEq(t, `{"found":"invoice:INV-42"}`, string(rp.Result))

			// A's zombie commit, with its own secret but under its old token, is fenced out
			// and kept as evidence.
			before := ok[mcpserver.ResidualView](t, b, "inspect_residual", m{"key": a.Key})
			e1 := fails(t, b, "commit_call", m{"key": a.Key, "token": a.Token, "lease_secret": a.LeaseSecret, "outcome": "succeeded", "result": m{"charge": "ch_zombie"}})
			require.Equal(t, mcpwire.KindLeaseLost, e1.Kind)
			require.NotNil(t, e1.Violation)
			require.Equal(t, interceptor.LeaseLost, e1.Violation.Kind, "one name: the wire says lease_lost for the kind as for the error")
			require.Equal(t, a.Holder, e1.Violation.Holder)
			after := ok[mcpserver.ResidualView](t, b, "inspect_residual", m{"key": a.Key})
			require.Equal(t, residual.Succeeded, after.State)
			require.Equal(t, before.Result, after.Result, "the zombie's result is not recorded")
			require.Equal(t, before.Token, after.Token)
			require.Len(t, after.Evidence, len(before.Evidence)+1)
			ev := after.Evidence[len(after.Evidence)-1]
			require.Equal(t, a.Holder, ev.Holder)
			require.Equal(t, a.Token, ev.Token)
			require.JSONEq(t, `{"charge":"ch_zombie"}`, string(ev.Result))
			require.Len(t, after.Resolutions, 1)
			require.Equal(t, mcpwire.KindLeaseLost, fails(t, b, "renew_lease", m{"key": a.Key, "token": a.Token, "lease_secret": a.LeaseSecret, "lease_ms": 1000}).Kind)
		})
	}
}
