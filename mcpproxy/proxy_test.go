package mcpproxy_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// bundle is one test's world: a store, an effects file, a mode file and a policy.
type bundle struct {
	t                         *testing.T
	store, effects, mode, pol string
	// catalog holds append's description (absent: the default), task the status tasks/get
	// answers, pins the pins file the proxy loads when it exists.
	catalog, task, pins string
}

func setup(t *testing.T, policy string) *bundle {
	t.Helper()
	dir := t.TempDir()
	b := &bundle{t: t, store: filepath.Join(dir, "store"), effects: filepath.Join(dir, "effects"), mode: filepath.Join(dir, "mode"),
		catalog: filepath.Join(dir, "catalog"), task: filepath.Join(dir, "task"), pins: filepath.Join(dir, "pins.json")}
	if policy != "" {
		b.pol = filepath.Join(dir, "policy.json")
		if !strings.HasPrefix(strings.TrimSpace(policy), "{") {
			b.pol = filepath.Join(dir, "policy.yaml")
		}
		require.NoError(t, os.WriteFile(b.pol, []byte(policy), 0o600))
	}
	b.setMode("ok")
	return b
}

func (b *bundle) setMode(m string) { require.NoError(b.t, os.WriteFile(b.mode, []byte(m), 0o600)) }

func (b *bundle) env(role string) []string {
	return append(os.Environ(), "TOOLFENCE_TEST_ROLE="+role, "TF_STORE="+b.store, "TF_EFFECTS="+b.effects, "TF_MODE="+b.mode, "TF_POLICY="+b.pol,
		"TF_CATALOG="+b.catalog, "TF_TASK="+b.task, "TF_PINS="+b.pins)
}

// host connects an official Go SDK client over stdio to a fresh proxy process (role
// "proxy"), or straight to the upstream fixture (role "upstream"). Closing it ends the process.
func (b *bundle) host(role string) *mcp.ClientSession {
	b.t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = b.env(role)
	cmd.Stderr = os.Stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1.0.0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = s.Close() })
	return s
}

// effectCount is the number of effects the upstream wrote.
func (b *bundle) effectCount() int {
	data, err := os.ReadFile(b.effects)
	if os.IsNotExist(err) {
		return 0
	}
	require.NoError(b.t, err)
	return strings.Count(string(data), "\n")
}

// residuals opens the store (the proxy must have exited) and returns its residuals.
func (b *bundle) residuals() []*residual.Residual {
	l, err := badger.Open(b.store, badger.Options{})
	require.NoError(b.t, err)
	defer l.Close()
	page, err := l.List(context.Background(), ledger.ListParams{Namespace: "default"})
	require.NoError(b.t, err)
	return page.Residuals
}

func call(t *testing.T, s *mcp.ClientSession, tool string, args map[string]any, meta mcp.Meta) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args, Meta: meta})
	require.NoError(t, err)
	return res
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// errorKind is the kind in the _meta details of an isError result the proxy made.
func errorKind(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	raw, err := json.Marshal(res.Meta[mcpwire.MetaError])
	require.NoError(t, err)
	var info struct {
		Kind string `json:"kind"`
	}
	require.NoError(t, json.Unmarshal(raw, &info))
	return info.Kind
}

func TestProxySameCallTwiceIsOneEffectThenReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	s := b.host("proxy")
	first := call(t, s, "append", args, nil)
	require.False(t, first.IsError, text(first))
	require.Equal(t, "appended hello to inbox:bob", text(first), "the first answer is upstream's own")
	require.Nil(t, first.Meta[mcpwire.MetaReplayed])

	second := call(t, s, "append", args, nil)
	require.False(t, second.IsError)
	require.Equal(t, true, second.Meta[mcpwire.MetaReplayed])
	require.Len(t, second.Content, 2)
	require.True(t, strings.HasPrefix(second.Content[0].(*mcp.TextContent).Text, "[replayed] not sent"), text(second))
	require.Equal(t, "appended hello to inbox:bob", second.Content[1].(*mcp.TextContent).Text)
	require.Equal(t, 1, b.effectCount())
	require.NoError(t, s.Close())

	// A new proxy process on the same store: still a replay (the default task is stable).
	s = b.host("proxy")
	third := call(t, s, "append", args, nil)
	require.Equal(t, true, third.Meta[mcpwire.MetaReplayed], text(third))
	require.Equal(t, 1, b.effectCount())

	// A new task in the request's _meta is a new key: the deliberate repeat happens.
	fourth := call(t, s, "append", args, mcp.Meta{mcpwire.MetaTask: "run-2"})
	require.False(t, fourth.IsError, text(fourth))
	require.Nil(t, fourth.Meta[mcpwire.MetaReplayed])
	require.Equal(t, 2, b.effectCount())
	require.NoError(t, s.Close())

	rs := b.residuals()
	require.Len(t, rs, 2)
	for _, r := range rs {
		require.Equal(t, "fixture/append", r.Operation)
		require.Equal(t, residual.Succeeded, r.State)
		require.True(t, strings.HasPrefix(r.Target, "args:"), "no policy: the target is the digest of the arguments")
	}
}

func TestProxyIsErrorWithoutNoEffectRuleIsUnknownAndBlocks(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	b.setMode("iserror")
	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	s := b.host("proxy")
	first := call(t, s, "append", args, nil)
	require.True(t, first.IsError)
	require.Equal(t, "unknown_outcome", errorKind(t, first))
	require.Contains(t, text(first), "outcome unknown; do not retry")
	require.Contains(t, text(first), "boom after the write", "upstream's own text follows the observation")

	b.setMode("ok")
	second := call(t, s, "append", args, nil)
	require.True(t, second.IsError)
	require.Equal(t, "unknown_outcome", errorKind(t, second))
	require.Equal(t, 1, b.effectCount(), "nothing dispatched for the blocked call")
	require.NoError(t, s.Close())
	rs := b.residuals()
	require.Len(t, rs, 1)
	require.Equal(t, residual.Unknown, rs[0].State)
}

func TestProxyNoEffectRuleRecordsFailedAndRetryDispatches(t *testing.T) {
	t.Parallel()
	b := setup(t, `{"tools": {"append": {"target": ["/target"], "no_effect": {"patterns": ["^rejected:"]}}}}`)
	b.setMode("reject")
	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	s := b.host("proxy")
	first := call(t, s, "append", args, nil)
	require.True(t, first.IsError)
	require.Equal(t, "rejected: the mailbox is full, nothing was sent", text(first), "a proven no-effect answer is upstream's own")
	require.Equal(t, 0, b.effectCount())

	b.setMode("ok")
	second := call(t, s, "append", args, nil)
	require.False(t, second.IsError, text(second))
	require.Nil(t, second.Meta[mcpwire.MetaReplayed])
	require.Equal(t, 1, b.effectCount())
	require.NoError(t, s.Close())
	rs := b.residuals()
	require.Len(t, rs, 1)
	require.Equal(t, residual.Succeeded, rs[0].State)
	require.Equal(t, "inbox:bob", rs[0].Target)
	require.Len(t, rs[0].Attempts, 2)
	require.Equal(t, residual.Failed, rs[0].Attempts[0].Outcome)
}

func TestProxyRewordedCallOnSameTargetIsPayloadMismatch(t *testing.T) {
	t.Parallel()
	b := setup(t, `{"tools": {"append": {"target": ["/target"]}}}`)
	s := b.host("proxy")
	first := call(t, s, "append", map[string]any{"target": "inbox:bob", "text": "hello"}, nil)
	require.False(t, first.IsError, text(first))
	second := call(t, s, "append", map[string]any{"target": "inbox:bob", "text": "hello there, Bob"}, nil)
	require.True(t, second.IsError)
	require.Equal(t, "payload_mismatch", errorKind(t, second))
	require.Contains(t, text(second), "already done")
	require.Contains(t, text(second), "with different arguments; it was not repeated")
	require.Equal(t, 1, b.effectCount())
}

func TestProxyForwardsBypassedToolsAndTheToolListUntouched(t *testing.T) {
	t.Parallel()
	b := setup(t, `{"tools": {"note": {"mode": "bypass"}}}`)
	direct := b.host("upstream")
	ctx := context.Background()
	want, err := direct.ListTools(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, direct.Close())

	s := b.host("proxy")
	got, err := s.ListTools(ctx, nil)
	require.NoError(t, err)
	wantJSON, _ := json.Marshal(want)
	gotJSON, _ := json.Marshal(got)
	require.JSONEq(t, string(wantJSON), string(gotJSON))

	args := map[string]any{"target": "t", "text": "x"}
	for range 2 {
		res := call(t, s, "note", args, nil)
		require.False(t, res.IsError)
		require.Equal(t, "noted", text(res))
		require.Nil(t, res.Meta[mcpwire.MetaReplayed])
	}
	require.Equal(t, 2, b.effectCount(), "a bypassed tool is not guarded")
	for i := range 2 {
		res := call(t, s, "read", nil, nil)
		require.False(t, res.IsError)
		require.Equal(t, "2 lines", text(res), "read-only call %d forwarded", i)
	}
	require.NoError(t, s.Close())
	require.Empty(t, b.residuals(), "bypassed and read-only calls leave no residual")
}

func TestProxyUpstreamThatHangsIsUnknownAndBlocks(t *testing.T) {
	t.Parallel()
	b := setup(t, `{"tools": {"append": {"target": ["/target"], "timeout": "500ms"}}}`)
	b.setMode("hang")
	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	s := b.host("proxy")
	first := call(t, s, "append", args, nil)
	require.True(t, first.IsError)
	require.Equal(t, "unknown_outcome", errorKind(t, first))
	b.setMode("ok")
	second := call(t, s, "append", args, nil)
	require.Equal(t, "unknown_outcome", errorKind(t, second))
	require.Equal(t, 1, b.effectCount())
}

func TestProxyRefusesEveryCallWhenThePolicyNamesAnUnknownTool(t *testing.T) {
	t.Parallel()
	b := setup(t, `{"tools": {"send_mail": {"target": ["/to"]}}}`)
	s := b.host("proxy")
	res := call(t, s, "append", map[string]any{"target": "a", "text": "b"}, nil)
	require.True(t, res.IsError)
	require.Equal(t, string(mcpwire.KindPolicy), errorKind(t, res))
	require.Contains(t, text(res), `the policy names tool "send_mail", which server "fixture" does not list`)
	require.Contains(t, text(res), "nothing was sent upstream")
	require.Equal(t, 0, b.effectCount())
	require.NoError(t, s.Close())
	require.Empty(t, b.residuals())
}

func TestParsePolicyRefusesBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, doc, want string }{
		{"unknown top-level key", `{"tool": {}}`, `unknown key "tool" (want one of: tools)`},
		{"unknown tool key", `{"tools": {"a": {"targets": ["/x"]}}}`, `tool "a": unknown key "targets"`},
		{"unknown no_effect key", `{"tools": {"a": {"no_effect": {"code": [1]}}}}`, `tool "a": no_effect: unknown key "code" (want one of: codes, patterns)`},
		{"bad mode", `{"tools": {"a": {"mode": "guard"}}}`, `tool "a": mode "guard": want "protect" or "bypass"`},
		{"bad pointer", `{"tools": {"a": {"target": ["to"]}}}`, `tool "a": target:`},
		{"bad pattern", `{"tools": {"a": {"no_effect": {"patterns": ["("]}}}}`, `tool "a": no_effect pattern`},
		{"bad lease", `{"tools": {"a": {"lease": 30}}}`, `want a duration string`},
		{"bypass with target", `{"tools": {"a": {"mode": "bypass", "target": ["/x"]}}}`, `tool "a": mode bypass takes no target`},
		{"trailing data", `{"tools": {}} {}`, `trailing data`},
		{"not JSON", `{tools: {}}`, `invalid character`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.Parse([]byte(tc.doc))
			require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
			require.ErrorContains(t, err, tc.want)
		})
	}
	p, err := policy.Parse([]byte(`{"tools": {"a": {"mode": "protect", "target": ["/to", "/id"], "lease": "10s", "timeout": "1m",
		"no_effect": {"codes": [-32000], "patterns": ["^invalid"]}}, "b": {"mode": "bypass"}}}`))
	require.NoError(t, err)
	require.Equal(t, policy.Duration(10*time.Second), p.Tools["a"].Lease)
}
