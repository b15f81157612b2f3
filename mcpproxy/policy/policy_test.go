package policy_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
)

func TestParsePolicyYAMLMeetsTheSameRules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, doc, want string }{
		{"unknown top-level key", "tool: {}\n", `unknown key "tool" (want one of: tools)`},
		{"unknown tool key", "tools:\n  a:\n    targets: [/x]\n", `tool "a": unknown key "targets"`},
		{"unknown probe key", "tools:\n  a:\n    probe: {tool: b, found: /f, args: {}}\n", `tool "a": probe: unknown key "args"`},
		{"unknown key key", "tools:\n  a:\n    key: {header: X}\n", `tool "a": key: unknown key "header"`},
		{"bad mode", "tools:\n  a: {mode: guard}\n", `tool "a": mode "guard": want "protect" or "bypass"`},
		{"bad YAML", "tools:\n  a: [\n", `YAML:`},
		{"duplicate key", "tools:\n  a: {}\n  a: {}\n", `already defined`},
		{"key in another case", "tools:\n  a: {mode: protect, Mode: bypass}\n", `tool "a": key "Mode": write it "mode" (keys are case-sensitive)`},
		{"second document", "tools: {}\n---\ntools: {}\n", `a second YAML document`},
		{"not a mapping", "- a\n", `must be a mapping`},
		{"empty", "\n", `the policy is empty`},
		{"number lease", "tools:\n  a: {lease: 30}\n", `want a duration string`},
		{"probe without tool", "tools:\n  a:\n    probe: {found: /f}\n", `probe: tool is required`},
		{"probe of itself", "tools:\n  a:\n    probe: {tool: a, found: /f}\n", `is the protected tool itself`},
		{"probe without found", "tools:\n  a:\n    probe: {tool: b}\n", `probe: found is required`},
		{"probe bad pointer", "tools:\n  a:\n    probe: {tool: b, found: /f, arguments: {id: id}}\n", `probe argument "id"`},
		{"key with both", "tools:\n  a:\n    key: {argument: k, meta: m}\n", `key: set exactly one`},
		{"key with neither", "tools:\n  a:\n    key: {}\n", `key: set exactly one`},
		{"bypass with probe", "tools:\n  a:\n    mode: bypass\n    probe: {tool: b, found: /f}\n", `mode bypass takes no target, no_effect, probe, key, repeats or repeat_window`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.Parse([]byte(tc.doc))
			require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
			require.ErrorContains(t, err, tc.want)
		})
	}
	p, err := policy.Parse([]byte(`
tools:
  charge:
    mode: protect
    target: ["/order_id"]
    lease: 10s
    no_effect: {codes: [-32000], patterns: ["^card declined"]}
    probe:
      tool: find_charge
      arguments: {order_id: /order_id}
      found: /found
    key:
      argument: idempotency_key
  search: {mode: bypass}
`))
	require.NoError(t, err)
	c := p.Tools["charge"]
	require.Equal(t, policy.Duration(10*time.Second), c.Lease)
	require.Equal(t, []int64{-32000}, c.NoEffect.Codes)
	require.Equal(t, &policy.ProbeRule{Tool: "find_charge", Arguments: map[string]string{"order_id": "/order_id"}, Found: "/found"}, c.Probe)
	require.Equal(t, &policy.KeyRule{Argument: "idempotency_key"}, c.Key)
	require.Equal(t, policy.Bypass, p.Tools["search"].Mode)
}

// TestParsePolicyRefusesAmbiguousKeys: encoding/json keeps the last of repeated keys and
// matches keys regardless of case, so a tool listed twice, or "mode" beside "Mode", would
// decide a tool's protection by key order. Each is refused, naming where it is.
func TestParsePolicyRefusesAmbiguousKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, doc, want string }{
		{"tool twice", `{"tools": {"charge": {"mode": "protect", "target": ["/order_id"]}, "charge": {"mode": "bypass"}}}`, `tools: key "charge" is given twice`},
		{"rule key twice", `{"tools": {"charge": {"mode": "protect", "mode": "bypass"}}}`, `tool "charge": key "mode" is given twice`},
		{"tools twice", `{"tools": {}, "tools": {"charge": {"mode": "bypass"}}}`, `key "tools" is given twice`},
		{"probe argument twice", `{"tools": {"c": {"probe": {"tool": "f", "found": "/x", "arguments": {"id": "/a", "id": "/b"}}}}}`, `tool "c": probe: arguments: key "id" is given twice`},
		{"mode in another case", `{"tools": {"charge": {"Mode": "bypass"}}}`, `tool "charge": key "Mode": write it "mode" (keys are case-sensitive)`},
		{"tools in another case", `{"Tools": {"charge": {"mode": "bypass"}}}`, `key "Tools": write it "tools"`},
		{"no_effect key in another case", `{"tools": {"c": {"no_effect": {"Patterns": ["x"]}}}}`, `tool "c": no_effect: key "Patterns": write it "patterns"`},
		{"unknown rule key", `{"tools": {"c": {"targets": ["/a"]}}}`, `tool "c": unknown key "targets" (want one of: key, lease, mode, no_effect, probe, repeat_window, repeats, target, timeout)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.Parse([]byte(tc.doc))
			require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
			require.ErrorContains(t, err, tc.want)
		})
	}
	// Tool names are the upstream's, and case-sensitive: two that differ in case are two tools.
	p, err := policy.Parse([]byte(`{"tools": {"charge": {"mode": "protect"}, "Charge": {"mode": "bypass"}}}`))
	require.NoError(t, err)
	require.Equal(t, policy.Protect, p.Tools["charge"].Mode)
	require.Equal(t, policy.Bypass, p.Tools["Charge"].Mode)
	// Malformed JSON is still reported by the decoder, with its offset.
	_, err = policy.Parse([]byte(`{"tools": {"c": {"mode": "protect"}}`))
	require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
	require.ErrorContains(t, err, "unexpected EOF")
}

func TestParsePinsRefusesBadInput(t *testing.T) {
	t.Parallel()
	good := `"sha256:` + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" + `"`
	for _, tc := range []struct{ name, doc, want string }{
		{"not JSON", `server_id: x`, `invalid character`},
		{"unknown key", `{"server_id": "pay", "tools": {}, "version": 1}`, `unknown field "version"`},
		{"no server id", `{"tools": {}}`, `server_id ""`},
		{"bad server id", `{"server_id": "a b", "tools": {}}`, `server_id "a b"`},
		{"no tools", `{"server_id": "pay"}`, `no "tools" object`},
		{"bad digest", `{"server_id": "pay", "tools": {"charge": "abc"}}`, `tool "charge": pin "abc"`},
		{"trailing data", `{"server_id": "pay", "tools": {"charge": ` + good + `}} {}`, `trailing data`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.ParsePins([]byte(tc.doc))
			require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
			require.ErrorContains(t, err, tc.want)
		})
	}
	p, err := policy.ParsePins([]byte(`{"server_id": "pay", "tools": {"charge": ` + good + `}}`))
	require.NoError(t, err)
	require.Equal(t, "pay", p.ServerID)
}

// TestParseRefusesTheProxysOwnHTTPErrorCodeAsNoEffect: the code transport makes up for an
// HTTP upstream that gave no answer never proves no effect (policy keeps its own copy of
// the code; this holds the two equal).
// -32099, the code of older proxies (one may be the upstream of this one), is refused too.
func TestParseRefusesTheProxysOwnHTTPErrorCodeAsNoEffect(t *testing.T) {
	t.Parallel()
	require.EqualValues(t, -32010, transport.CodeUpstreamHTTP)
	for _, code := range []string{fmt.Sprint(transport.CodeUpstreamHTTP), "-32099"} {
		_, err := policy.Parse([]byte(`{"tools":{"charge":{"no_effect":{"codes":[-32000,` + code + `]}}}}`))
		require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
		require.Contains(t, err.Error(), code)
		require.Contains(t, err.Error(), `"charge"`)
	}
}
