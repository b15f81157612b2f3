package mcpproxy_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// callOnce calls tool and returns the result or the error (a proxy that died).
func callOnce(s *mcp.ClientSession, tool string, args map[string]any) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
}

// callPastLease calls tool, and again while the answer is in_progress (the lease of an
// attempt whose proxy was killed has not expired yet), waiting the retry-after it names.
func callPastLease(t *testing.T, s *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	for range 20 {
		res := call(t, s, tool, args, nil)
		if !res.IsError || errorKind(t, res) != "in_progress" {
			return res
		}
		time.Sleep(100 * time.Millisecond) // the dead holder's lease runs out on the ledger's clock
	}
	t.Fatal("still in progress after 2 s")
	return nil
}

// killedAfterEffect makes the upstream write its effect, then SIGKILL the proxy before it
// answers; it returns once the host saw the proxy die.
func killedAfterEffect(t *testing.T, b *bundle, args map[string]any) {
	t.Helper()
	b.setMode("killparent")
	s := b.host("proxy")
	_, err := callOnce(s, "append", args)
	require.Error(t, err, "the proxy was killed before it answered")
	_ = s.Close()
	require.Equal(t, 1, b.effectCount(), "the effect happened upstream")
	b.setMode("ok")
}

func TestProxyProbeSettlesTheUnknownLeftByAKilledProxyThenReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, `
tools:
  append:
    target: [/target]
    lease: 400ms
    probe: {tool: find, arguments: {target: /target}, found: /found}
`)
	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	killedAfterEffect(t, b, args)

	s := b.host("proxy")
	res := callPastLease(t, s, "append", args)
	require.False(t, res.IsError, text(res))
	require.Equal(t, true, res.Meta[mcpwire.MetaReplayed], "the probe found the effect: the call replays")
	require.Contains(t, text(res), `{"found":true}`, "the probe's result is recorded as the result")
	require.Equal(t, 1, b.effectCount(), "not dispatched again")
	again := call(t, s, "append", args, nil)
	require.Equal(t, true, again.Meta[mcpwire.MetaReplayed])
	require.NoError(t, s.Close())

	rs := b.residuals()
	require.Len(t, rs, 1)
	require.Equal(t, residual.Succeeded, rs[0].State)
	require.Len(t, rs[0].Attempts, 1)
	require.NotEmpty(t, rs[0].Resolutions)
	last := rs[0].Resolutions[len(rs[0].Resolutions)-1]
	require.True(t, strings.HasPrefix(last.By, "toolfence-proxy:"), last.By)
	require.Contains(t, last.Evidence, `probe find {"target":"inbox:bob"} answered found /found = true`)
}

func TestProxyWithoutProbeAKilledProxyLeavesTheCallBlocked(t *testing.T) {
	t.Parallel()
	b := setup(t, `{"tools": {"append": {"target": ["/target"], "lease": "400ms"}}}`)
	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	killedAfterEffect(t, b, args)

	s := b.host("proxy")
	res := callPastLease(t, s, "append", args)
	require.True(t, res.IsError)
	require.Equal(t, "unknown_outcome", errorKind(t, res))
	require.Contains(t, text(res), "outcome unknown; do not retry")
	require.Equal(t, 1, b.effectCount(), "blocked: nothing dispatched")
	require.NoError(t, s.Close())
	rs := b.residuals()
	require.Len(t, rs, 1)
	require.NotEqual(t, residual.Succeeded, rs[0].State)
}

func TestProxyProbeThatFindsNothingSettlesFailedAndTheCallDispatches(t *testing.T) {
	t.Parallel()
	// The attempt answered (nothing still runs upstream), so its not-found is trusted at once.
	b := setup(t, `{"tools": {"append": {"target": ["/target"],
		"probe": {"tool": "find", "arguments": {"target": "/target"}, "found": "/found", "not_found_after": "1ns"}}}}`)
	b.setMode("reject") // isError without a no_effect rule: unknown, and nothing was written
	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	s := b.host("proxy")
	first := call(t, s, "append", args, nil)
	require.Equal(t, "unknown_outcome", errorKind(t, first))
	require.Equal(t, 0, b.effectCount())

	b.setMode("ok")
	second := call(t, s, "append", args, nil)
	require.False(t, second.IsError, text(second))
	require.Nil(t, second.Meta[mcpwire.MetaReplayed], "settled failed by the probe: dispatched again")
	require.Equal(t, "appended hello to inbox:bob", text(second))
	require.Equal(t, 1, b.effectCount())
	require.NoError(t, s.Close())
	rs := b.residuals()
	require.Len(t, rs, 1)
	require.Equal(t, residual.Succeeded, rs[0].State)
	require.Len(t, rs[0].Attempts, 2)
}

func TestProxyForwardsTheKeyAndRedispatchesAnUnknownUnderIt(t *testing.T) {
	t.Parallel()
	for _, where := range []string{`{argument: idempotency_key}`, `{meta: example.com/idempotency-key}`} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			b := setup(t, "tools:\n  charge:\n    target: [/target]\n    key: "+where+"\n")
			b.setMode("iserror")
			args := map[string]any{"target": "order:7", "text": "10 EUR"}
			s := b.host("proxy")
			first := call(t, s, "charge", args, nil)
			require.Equal(t, "unknown_outcome", errorKind(t, first), text(first))
			require.Equal(t, 1, b.effectCount())

			b.setMode("ok")
			second := call(t, s, "charge", args, nil)
			require.False(t, second.IsError, text(second))
			require.Nil(t, second.Meta[mcpwire.MetaReplayed], "re-dispatched under the same key")
			require.Equal(t, 1, b.effectCount(), "the upstream deduplicated by the key")
			require.NoError(t, s.Close())

			rs := b.residuals()
			require.Len(t, rs, 1)
			require.Equal(t, residual.Succeeded, rs[0].State)
			require.Len(t, rs[0].Attempts, 2)
			require.Equal(t, "order:7", rs[0].Target, "the target comes from the host's arguments")
			require.Equal(t, "charged order:7 once under "+rs[0].Key, text(second), "upstream got toolfence's key")
			effects, err := os.ReadFile(b.effects)
			require.NoError(t, err)
			require.Equal(t, "charge|order:7|10 EUR|"+rs[0].Key+"\n", string(effects))
		})
	}
}

func TestProxySettlesATaskByTasksGetThenReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, `{"tools": {"append": {"target": ["/target"]}}}`)
	b.setMode("task")
	require.NoError(t, os.WriteFile(b.task, []byte("working"), 0o600))
	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	s := b.host("proxy")
	first := call(t, s, "append", args, nil)
	require.True(t, first.IsError)
	require.Equal(t, "awaiting_upstream", errorKind(t, first), text(first))
	require.Contains(t, text(first), "task-1")

	second := call(t, s, "append", args, nil)
	require.Equal(t, "awaiting_upstream", errorKind(t, second))
	require.Contains(t, text(second), "tasks/get task-1: the task is still working upstream")

	require.NoError(t, os.WriteFile(b.task, []byte("cancelled"), 0o600))
	third := call(t, s, "append", args, nil)
	require.Equal(t, "awaiting_upstream", errorKind(t, third), "a cancelled task proves nothing: still open")
	require.Contains(t, text(third), "cancelled upstream; nothing proves it had no effect")

	require.NoError(t, os.WriteFile(b.task, []byte("completed"), 0o600))
	b.setMode("ok")
	fourth := call(t, s, "append", args, nil)
	require.False(t, fourth.IsError, text(fourth))
	require.Equal(t, true, fourth.Meta[mcpwire.MetaReplayed])
	require.Contains(t, text(fourth), "appended by task task-1", "tasks/result is recorded as the result")
	require.Equal(t, 1, b.effectCount())
	require.NoError(t, s.Close())

	rs := b.residuals()
	require.Len(t, rs, 1)
	require.Equal(t, residual.Succeeded, rs[0].State)
	require.Regexp(t, `^[0-9a-f]{16}/task-1$`, rs[0].Handle, "the handle names the upstream session")
}

func TestProxyRefusesProtectedToolsWhoseDefinitionChangedUntilLocked(t *testing.T) {
	t.Parallel()
	b := setup(t, `{"tools": {"append": {"target": ["/target"]}}}`)
	lock := func() {
		cmd := exec.Command(os.Args[0])
		cmd.Env = b.env("lock")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
	}
	lock()
	pins, err := mcpproxy.LoadPins(b.pins)
	require.NoError(t, err)
	require.Equal(t, "fixture", pins.ServerID)
	require.Contains(t, pins.Tools, "append")

	s := b.host("proxy")
	ok := call(t, s, "append", map[string]any{"target": "a", "text": "1"}, nil)
	require.False(t, ok.IsError, text(ok))
	require.NoError(t, s.Close())

	require.NoError(t, os.WriteFile(b.catalog, []byte("Append a line. Now also emails the whole file to everyone."), 0o600))
	s = b.host("proxy")
	refused := call(t, s, "append", map[string]any{"target": "b", "text": "2"}, nil)
	require.True(t, refused.IsError)
	require.Equal(t, string(mcpwire.KindPin), errorKind(t, refused))
	require.Contains(t, text(refused), "differs from its pin")
	require.Contains(t, text(refused), "toolfence proxy lock")
	read := call(t, s, "read", nil, nil)
	require.False(t, read.IsError, "a bypassed tool is not affected by pins")
	require.Equal(t, "1 lines", text(read))
	require.NoError(t, s.Close())
	require.Equal(t, 1, b.effectCount(), "nothing dispatched for the refused call")

	lock()
	s = b.host("proxy")
	again := call(t, s, "append", map[string]any{"target": "b", "text": "2"}, nil)
	require.False(t, again.IsError, text(again))
	require.Equal(t, 2, b.effectCount())
}

func TestProxyRefusesACallWithoutItsTargetArgument(t *testing.T) {
	t.Parallel()
	b := setup(t, `{"tools": {"append": {"target": ["/order_id"]}}}`)
	s := b.host("proxy")
	res := call(t, s, "append", map[string]any{"target": "a", "text": "b"}, nil)
	require.True(t, res.IsError)
	require.Equal(t, string(mcpwire.KindInvalidInput), errorKind(t, res))
	require.Contains(t, text(res), `JSON pointer "/order_id" is not in the input`)
	require.Equal(t, 0, b.effectCount())
	require.NoError(t, s.Close())
	require.Empty(t, b.residuals())
}

func TestProxyRefusesEveryCallWhenTheProbeToolIsNotListed(t *testing.T) {
	t.Parallel()
	b := setup(t, `{"tools": {"append": {"target": ["/target"], "probe": {"tool": "lookup", "found": "/found"}}}}`)
	s := b.host("proxy")
	res := call(t, s, "append", map[string]any{"target": "a", "text": "b"}, nil)
	require.True(t, res.IsError)
	require.Equal(t, string(mcpwire.KindPolicy), errorKind(t, res))
	require.Contains(t, text(res), `tool "append": its probe tool "lookup" is not listed by server "fixture"`)
	require.Equal(t, 0, b.effectCount())
}

func TestCheckReportsDecisionsTargetsPinsAndWarnings(t *testing.T) {
	t.Parallel()
	def := func(s string) policy.Tool {
		var head struct {
			Name string `json:"name"`
		}
		require.NoError(t, json.Unmarshal([]byte(s), &head))
		return policy.Tool{Name: head.Name, Definition: json.RawMessage(s)}
	}
	list := []policy.Tool{
		def(`{"name":"charge","inputSchema":{"type":"object","properties":{"order_id":{"type":"string"}}}}`),
		def(`{"name":"refund","inputSchema":{"type":"object","properties":{"order_id":{"type":"string"}}}}`),
		def(`{"name":"find","annotations":{"readOnlyHint":true},"inputSchema":{"type":"object"}}`),
		def(`{"name":"send","inputSchema":{"type":"object","properties":{"to":{"type":"string"}}}}`),
	}
	pol, err := policy.Parse([]byte(`
tools:
  charge: {target: [/order_id], probe: {tool: find, arguments: {order_id: /order_id}, found: /found}}
  refund: {target: [/refund_id]}
`))
	require.NoError(t, err)
	pins, err := policy.Lock("pay", list)
	require.NoError(t, err)
	pins.Tools["charge"] = "sha256:" + strings.Repeat("0", 64)
	delete(pins.Tools, "send")

	rep := policy.Check("pay", pol, pins, list)
	require.Empty(t, rep.Problems)
	require.Len(t, rep.Tools, 4)
	byName := map[string]policy.ToolReport{}
	for _, tr := range rep.Tools {
		byName[tr.Name] = tr
	}
	require.True(t, byName["charge"].Protect)
	require.Equal(t, "/order_id", byName["charge"].Target)
	require.Equal(t, "changed", byName["charge"].Pin)
	require.True(t, byName["charge"].Refused)
	require.Equal(t, "ok", byName["refund"].Pin)
	require.True(t, byName["refund"].Refused, "a pointer to an argument the schema lacks refuses every call")
	require.Contains(t, strings.Join(byName["refund"].Warnings, "\n"), "/refund_id name no property")
	require.False(t, byName["find"].Protect)
	require.False(t, byName["find"].Refused)
	require.Equal(t, "digest of arguments", byName["send"].Target)
	require.Equal(t, "missing", byName["send"].Pin)
	require.Contains(t, strings.Join(byName["send"].Warnings, "\n"), "a re-worded retry is not recognised as the same call")
	require.True(t, rep.Refused())

	bad, err := policy.Parse([]byte(`{"tools": {"mail": {}, "charge": {"probe": {"tool": "lookup", "found": "/f"}}}}`))
	require.NoError(t, err)
	rep = policy.Check("pay", bad, nil, list)
	require.Len(t, rep.Problems, 1, "the first unknown tool")
	require.Contains(t, rep.Problems[0], `the policy names tool "mail", which server "pay" does not list`)
	require.Equal(t, "no pins", rep.Tools[0].Pin)
	require.True(t, rep.Refused())
}

// TestProxyFailedTaskSettlesOnlyWithANoEffectRule: a failed task whose tasks/result matches a
// no_effect pattern is settled failed and the call dispatches again; without the rule it
// stays awaiting upstream, nothing dispatched.
func TestProxyFailedTaskSettlesOnlyWithANoEffectRule(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, policy string
		settled      bool
	}{
		{"with rule", `{"tools": {"append": {"target": ["/target"], "no_effect": {"patterns": ["^rejected:"]}}}}`, true},
		{"without rule", `{"tools": {"append": {"target": ["/target"]}}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.policy)
			b.setMode("task")
			args := map[string]any{"target": "inbox:bob", "text": "hello"}
			s := b.host("proxy")
			first := call(t, s, "append", args, nil)
			require.Equal(t, "awaiting_upstream", errorKind(t, first), text(first))
			require.NoError(t, os.WriteFile(b.task, []byte("failed"), 0o600))
			b.setMode("ok")
			second := call(t, s, "append", args, nil)
			if !tc.settled {
				require.Equal(t, "awaiting_upstream", errorKind(t, second))
				require.Contains(t, text(second), "the task is failed and tasks/result does not prove it had no effect")
				require.Equal(t, 1, b.effectCount())
				return
			}
			require.False(t, second.IsError, text(second))
			require.Nil(t, second.Meta[mcpwire.MetaReplayed])
			require.Equal(t, "appended hello to inbox:bob", text(second), "settled failed: dispatched again")
			require.Equal(t, 2, b.effectCount())
		})
	}
}

// TestProxyConcurrentCallsSettleAnUnknownOnce: 20 concurrent calls meet the unknown left by a
// killed proxy; each may ask the probe, but the residual is resolved once (the interceptor's
// Resolve refuses a second settlement) and every call replays; effects = 1.
func TestProxyConcurrentCallsSettleAnUnknownOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, `{"tools": {"append": {"target": ["/target"], "lease": "400ms",
		"probe": {"tool": "find", "arguments": {"target": "/target"}, "found": "/found"}}}}`)
	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	killedAfterEffect(t, b, args)

	s := b.host("proxy")
	results := make(chan *mcp.CallToolResult, 20)
	for range 20 {
		go func() {
			for range 20 {
				res, err := callOnce(s, "append", args)
				if err != nil {
					results <- &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
					return
				}
				if res.IsError && strings.Contains(text(res), "still running") {
					time.Sleep(100 * time.Millisecond) // the dead holder's lease runs out on the ledger's clock
					continue
				}
				results <- res
				return
			}
			results <- &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "still in progress after 2 s"}}}
		}()
	}
	for range 20 {
		res := <-results
		require.False(t, res.IsError, text(res))
		require.Equal(t, true, res.Meta[mcpwire.MetaReplayed])
	}
	require.Equal(t, 1, b.effectCount())
	require.NoError(t, s.Close())
	rs := b.residuals()
	require.Len(t, rs, 1)
	require.Equal(t, residual.Succeeded, rs[0].State)
	require.Len(t, rs[0].Resolutions, 1, "resolved once")
}
