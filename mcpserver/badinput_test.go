package mcpserver_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// TestBadInput: malformed arguments of every tool come back as isError invalid_input results
// whose text names the problem, and the ledger does not change.
func TestBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	c := e.dial(tokA, legacy)
	p := ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": "t", "operation": "charge", "target": "inv:1", "args": m{"n": 1}})
	require.Equal(t, mcpserver.DecisionProceed, p.Decision)
	key, token, secret := p.Key, p.Token, p.LeaseSecret
	bad := "tf1_" + strings.Repeat("g", 64)
	upper := "tf1_" + strings.Repeat("A", 64)
	big := m{"blob": strings.Repeat("x", 5000)} // over the 4 KiB MaxArgs of setup
	long := strings.Repeat("t", 5000)           // over the 4 KiB MaxField
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }

	cases := []struct {
		tool string
		args any
		want string
	}{
		{"begin_call", m{}, "task is required"},
		{"begin_call", m{"task": "t", "operation": "o", "target": "x"}, "args is required"},
		{"begin_call", m{"task": "t", "operation": "o", "args": m{}}, "target is required"},
		{"begin_call", m{"task": "t", "target": "x", "args": m{}}, "operation is required"},
		{"begin_call", m{"task": "t", "operation": "o", "target": "x", "args": []any{1}}, "args must be a JSON object"},
		{"begin_call", m{"task": "t", "operation": "o", "target": "x", "args": "{}"}, "args must be a JSON object"},
		{"begin_call", m{"task": 7, "operation": "o", "target": "x", "args": m{}}, `field "task" must be a string, got number`},
		{"begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}, "lease_ms": "long"}, `field "lease_ms" must be an integer, got string`},
		{"begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}, "lease_ms": 10}, "not longer than the safety margin"},
		{"begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}, "lease_ms": -5}, "negative"},
		{"begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}, "lease_ms": 1e10}, "exceeds the limit"},
		{"begin_call", m{"task": "t", "operation": "o", "target": "x", "args": big}, "the limit is 4096"},
		{"begin_call", m{"task": long, "operation": "o", "target": "x", "args": m{}}, "task is 5000 bytes long"},
		{"begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}, "tsak": "t"}, `unknown field "tsak"`},
		{"begin_call", raw(`{"task":"t","operation":"o","target":"x","args":{"a":1,"a":2}}`), `duplicate key "a"`},
		{"begin_call", []any{"t", "o"}, "arguments must be a JSON object"},
		{"commit_call", m{"key": key, "outcome": "succeeded"}, "token is required"},
		{"commit_call", m{"key": key, "token": -1, "outcome": "succeeded"}, `field "token" must be a non-negative integer`},
		{"commit_call", m{"key": key, "token": 1.5, "outcome": "succeeded"}, `field "token" must be a non-negative integer`},
		{"commit_call", m{"key": key, "token": "1", "outcome": "succeeded"}, `field "token" must be a non-negative integer, got string`},
		{"commit_call", m{"key": key, "token": token}, "outcome is required"},
		{"commit_call", m{"key": key, "token": token, "outcome": "done"}, `outcome "done": want succeeded, accepted, failed or unknown`},
		{"commit_call", m{"key": key, "token": token, "outcome": "Succeeded"}, `outcome "Succeeded"`},
		{"commit_call", m{"key": "nope", "token": token, "outcome": "failed"}, `key "nope" is not a toolfence key`},
		{"commit_call", m{"key": bad, "token": token, "outcome": "failed"}, "is not a toolfence key"},
		{"commit_call", m{"key": upper, "token": token, "outcome": "failed"}, "is not a toolfence key"},
		{"commit_call", m{"token": token, "outcome": "failed"}, "key is required"},
		{"commit_call", m{"key": key, "token": token, "outcome": "failed", "upstream_status": 1000}, "upstream_status 1000"},
		{"commit_call", m{"key": key, "token": token, "outcome": "succeeded", "result": m{"blob": strings.Repeat("x", 6000)}}, "result is"},
		{"commit_call", m{"key": key, "token": token, "outcome": "failed"}, "lease_secret is required"},
		{"commit_call", m{"key": key, "token": token, "outcome": "failed", "lease_secret": 42}, `field "lease_secret" must be a string`},
		{"commit_call", m{"key": key, "token": token, "outcome": "failed", "lease_secret": secret[:31]}, "32 lowercase hex digits"},
		{"renew_lease", m{"key": key, "token": token, "lease_secret": secret}, "lease_ms is required"},
		{"renew_lease", m{"key": key, "lease_ms": 1000, "lease_secret": secret}, "token is required"},
		{"renew_lease", m{"key": key, "token": token, "lease_ms": 1, "lease_secret": secret}, "safety margin"},
		{"renew_lease", m{"key": key, "token": token, "lease_ms": 1000}, "lease_secret is required"},
		{"resolve_residual", m{"key": key, "as": "maybe", "note": "n"}, `as "maybe": want succeeded or failed`},
		{"resolve_residual", m{"key": key, "note": "n"}, "as is required"},
		{"resolve_residual", m{"key": key, "as": "failed"}, "note is required"},
		// Every string that reaches the ledger is capped and free of control characters.
		{"resolve_residual", m{"key": key, "as": "failed", "note": "n", "by": strings.Repeat("b", 300)}, "by is 300 bytes long, the limit is 256"},
		{"resolve_residual", m{"key": key, "as": "failed", "note": "n", "by": "ops\x1b]0;pwned\x07"}, "by holds control characters"},
		{"resolve_residual", m{"key": key, "as": "failed", "note": "n", "by": "ops#0123"}, "by holds '#'"},
		{"resolve_residual", m{"key": key, "as": "failed", "note": "checked\x1b[2J"}, "note holds control characters"},
		{"resolve_residual", m{"key": key, "as": "failed", "note": "n", "evidence": "ok\x00"}, "evidence holds control characters"},
		{"begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}, "holder": strings.Repeat("h", 300)}, "holder is 300 bytes long"},
		{"begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}, "holder": "a\nb"}, "holder holds control characters"},
		{"commit_call", m{"key": key, "token": token, "lease_secret": secret, "outcome": "failed", "error": "x\x1b[1m"}, "error holds control characters"},
		{"resolve_residual", m{"key": key, "as": "failed", "note": "  "}, "note is required"},
		{"resolve_residual", m{"key": key, "as": "failed", "note": "n", "result": m{"x": 1}}, "only kept when resolving as succeeded"},
		{"resolve_residual", m{"key": "tf1_", "as": "failed", "note": "n"}, "is not a toolfence key"},
		{"inspect_residual", m{}, "key is required"},
		{"inspect_residual", m{"key": 42}, `field "key" must be a string, got number`},
		{"inspect_residual", m{"key": bad}, "is not a toolfence key"},
		{"list_pending", m{"state": "succeeded"}, `state "succeeded": want pending, unknown or accepted`},
		{"list_pending", m{"state": "bogus"}, `state "bogus"`},
		{"list_pending", m{"limit": 5000}, "limit 5000"},
		{"list_pending", m{"limit": "ten"}, `field "limit" must be an integer`},
		{"list_pending", m{"cursor": 3}, `field "cursor" must be a string`},
		{"reconcile", m{"key": key, "task": "t"}, "either key, or task"},
		{"reconcile", m{"key": bad}, "is not a toolfence key"},
	}
	before := snapshot(t, e.led, nsA)
	for _, tc := range cases {
		info := fails(t, c, tc.tool, tc.args)
		require.Equal(t, mcpwire.KindInvalidInput, info.Kind, "%s %v: %s", tc.tool, tc.args, info.Message)
		require.Contains(t, info.Message, tc.want, "%s %v", tc.tool, tc.args)
		require.Contains(t, info.Recovery, "nothing was written")
	}
	require.Equal(t, before, snapshot(t, e.led, nsA), "refused input changed the ledger")

	// Well-formed keys that do not exist are not found, not invalid.
	missing := residual.Key(nsA, "t", "o", "nobody")
	for _, tool := range []string{"inspect_residual", "reconcile"} {
		require.Equal(t, mcpwire.KindNotFound, fails(t, c, tool, m{"key": missing}).Kind, tool)
	}
	require.Equal(t, mcpwire.KindNotFound, fails(t, c, "commit_call", m{"key": missing, "token": 1, "outcome": "failed", "lease_secret": secret}).Kind)
	require.Equal(t, mcpwire.KindNotFound, fails(t, c, "resolve_residual", m{"key": missing, "as": "failed", "note": "n"}).Kind)
	// A token that was never issued is fenced out, without a write.
	info := fails(t, c, "commit_call", m{"key": key, "token": token + 5, "outcome": "failed", "lease_secret": secret})
	require.Equal(t, mcpwire.KindLeaseLost, info.Kind)
	require.Contains(t, info.Message, "never issued")
	require.Equal(t, before, snapshot(t, e.led, nsA))
}

// TestQueuedSuccessRefused: a succeeded commit of a 202 or queued answer is refused and
// leaves the residual pending, untouched; accepted with the handle is recorded.
func TestQueuedSuccessRefused(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	c := e.dial(tokA, modern)
	b := ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": "t", "operation": "deploy", "target": "svc:api", "args": m{"v": 3}})
	before := snapshot(t, e.led, nsA)
	for _, args := range []m{
		{"upstream_status": 202, "handle": "/deploys/77"},
		{"upstream_status": 200, "upstream_body": m{"status": "queued", "id": 77}},
		{"upstream_body": `{"state": "Pending"}`},
		{"result": m{"status": "processing"}},
	} {
		args["key"], args["token"], args["outcome"], args["lease_secret"] = b.Key, b.Token, "succeeded", b.LeaseSecret
		info := fails(t, c, "commit_call", args)
		require.Equal(t, mcpwire.KindRefused, info.Kind, "%v", args)
		require.Contains(t, info.Message, "not a confirmed effect")
		require.Contains(t, info.Recovery, "outcome=accepted with the handle")
		require.Equal(t, before, snapshot(t, e.led, nsA), "a refused commit changes nothing")
	}
	// Claiming "failed" for a queued answer is refused too: the effect is in flight.
	info := fails(t, c, "commit_call", m{"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "outcome": "failed", "upstream_status": 202})
	require.Equal(t, mcpwire.KindRefused, info.Kind)
	v := ok[mcpserver.ResidualView](t, c, "inspect_residual", m{"key": b.Key})
	require.Equal(t, residual.Pending, v.State)
	require.Equal(t, residual.None, v.Attempts[0].Outcome)
	require.Empty(t, v.Evidence)

	cm := ok[mcpserver.CommitResult](t, c, "commit_call", m{"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "outcome": "accepted", "upstream_status": 202, "handle": "/deploys/77"})
	require.Equal(t, residual.Accepted, cm.State)
	require.Equal(t, "/deploys/77", cm.Handle)
	list := ok[mcpserver.ListResult](t, c, "list_pending", m{"state": "accepted"})
	require.Len(t, list.Residuals, 1)
	require.Equal(t, "/deploys/77", list.Residuals[0].Handle)
	require.Contains(t, list.Residuals[0].Recovery, "/deploys/77")
}

// TestPanicRecovered: a panic inside a tool (here a registered classifier) is an isError
// result, and the server keeps serving.
func TestPanicRecovered(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	c := e.dial(tokA, legacy)
	b := ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": "t", "operation": opPanics, "target": "x", "args": m{}})
	info := fails(t, c, "commit_call", m{"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "outcome": "succeeded"})
	require.Equal(t, mcpwire.KindInternal, info.Kind)
	require.Contains(t, info.Message, "classifier exploded")
	v := ok[mcpserver.ResidualView](t, c, "inspect_residual", m{"key": b.Key})
	require.Equal(t, residual.Pending, v.State, "nothing was recorded")
}

// tickingClock moves a fake clock forward by step on every reading, like a slow process.
type tickingClock struct {
	*lease.Fake
	step time.Duration
}

func (c tickingClock) Now() time.Time {
	c.Advance(c.step)
	return c.Fake.Now()
}

// TestMarginTooSmall: when too little of the lease is left after the reservation, nothing
// is dispatched (the attempt is recorded as failed); a commit needs more than the margin
// left when it lands.
func TestMarginTooSmall(t *testing.T) {
	t.Parallel()
	ticking := tickingClock{Fake: lease.NewFake(t0), step: 30 * time.Millisecond}
	e := setupWith(t, interceptor.Options{Clock: ticking}, nil)
	c := e.dial(tokA, legacy)
	b := ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}, "lease_ms": 60})
	require.Equal(t, mcpserver.DecisionBlocked, b.Decision)
	require.Equal(t, interceptor.MarginTooSmall, b.Violation.Kind)
	require.Contains(t, b.Violation.Recovery, "longer lease_ms")
	v := ok[mcpserver.ResidualView](t, c, "inspect_residual", m{"key": b.Key})
	require.Equal(t, residual.Failed, v.State)
	require.Contains(t, v.Attempts[0].Error, "not dispatched")

	// With a long enough lease the same key proceeds (a failed attempt is retried)...
	b = ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}, "lease_ms": 1000})
	require.Equal(t, mcpserver.DecisionProceed, b.Decision)
	require.Equal(t, 2, b.Attempt)
	// ...but a commit landing within the margin of the expiry is fenced out.
	e.clock.Advance(960 * time.Millisecond)
	info := fails(t, c, "commit_call", m{"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "outcome": "succeeded"})
	require.Equal(t, mcpwire.KindLeaseLost, info.Kind)
	require.Contains(t, info.Message, "margin")
}
