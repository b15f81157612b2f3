package mcpproxy_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpproxy"
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
		{"bypass with probe", "tools:\n  a:\n    mode: bypass\n    probe: {tool: b, found: /f}\n", `mode bypass takes no target, no_effect, probe or key`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mcpproxy.ParsePolicy([]byte(tc.doc))
			require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
			require.ErrorContains(t, err, tc.want)
		})
	}
	p, err := mcpproxy.ParsePolicy([]byte(`
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
	require.Equal(t, mcpproxy.Duration(10*time.Second), c.Lease)
	require.Equal(t, []int64{-32000}, c.NoEffect.Codes)
	require.Equal(t, &mcpproxy.ProbeRule{Tool: "find_charge", Arguments: map[string]string{"order_id": "/order_id"}, Found: "/found"}, c.Probe)
	require.Equal(t, &mcpproxy.KeyRule{Argument: "idempotency_key"}, c.Key)
	require.Equal(t, mcpproxy.Bypass, p.Tools["search"].Mode)
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
		{"unknown rule key", `{"tools": {"c": {"targets": ["/a"]}}}`, `tool "c": unknown key "targets" (want one of: key, lease, mode, no_effect, probe, target, timeout)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mcpproxy.ParsePolicy([]byte(tc.doc))
			require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
			require.ErrorContains(t, err, tc.want)
		})
	}
	// Tool names are the upstream's, and case-sensitive: two that differ in case are two tools.
	p, err := mcpproxy.ParsePolicy([]byte(`{"tools": {"charge": {"mode": "protect"}, "Charge": {"mode": "bypass"}}}`))
	require.NoError(t, err)
	require.Equal(t, mcpproxy.Protect, p.Tools["charge"].Mode)
	require.Equal(t, mcpproxy.Bypass, p.Tools["Charge"].Mode)
	// Malformed JSON is still reported by the decoder, with its offset.
	_, err = mcpproxy.ParsePolicy([]byte(`{"tools": {"c": {"mode": "protect"}}`))
	require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
	require.ErrorContains(t, err, "unexpected EOF")
}

func TestLoadPolicyChoosesTheFormatByExtension(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, doc string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
		return path
	}
	_, err := mcpproxy.LoadPolicy(write("p.yml", "tools:\n  a: {target: [/to]}\n"))
	require.NoError(t, err)
	_, err = mcpproxy.LoadPolicy(write("p.json", "tools:\n  a: {target: [/to]}\n"))
	require.ErrorContains(t, err, "p.json: mcpproxy: invalid policy: invalid character", ".json is JSON only")
	_, err = mcpproxy.LoadPolicy(write("p.yaml", `{"tools": {"a": {"target": ["/to"]}}}`))
	require.NoError(t, err, "JSON is YAML too")
	_, err = mcpproxy.LoadPolicy(write("policy", "tools:\n  a: {mode: guard}\n"))
	require.ErrorContains(t, err, `policy: mcpproxy: invalid policy: tool "a": mode "guard"`)
	_, err = mcpproxy.LoadPolicy(filepath.Join(dir, "missing.yaml"))
	require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
}

// TestExamplePolicyParses: the commented example in docs/ is a valid policy.
func TestExamplePolicyParses(t *testing.T) {
	t.Parallel()
	p, err := mcpproxy.LoadPolicy(filepath.Join("..", "docs", "proxy-policy.example.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, p.Tools)
	var probes, keys int
	for _, tp := range p.Tools {
		if tp.Probe != nil {
			probes++
		}
		if tp.Key != nil {
			keys++
		}
	}
	require.Positive(t, probes, "the example shows a probe")
	require.Positive(t, keys, "the example shows key forwarding")
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
			_, err := mcpproxy.ParsePins([]byte(tc.doc))
			require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
			require.ErrorContains(t, err, tc.want)
		})
	}
	p, err := mcpproxy.ParsePins([]byte(`{"server_id": "pay", "tools": {"charge": ` + good + `}}`))
	require.NoError(t, err)
	require.Equal(t, "pay", p.ServerID)
}

func TestWritePinsIsAtomicAndRoundTrips(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "p.pins.json")
	pins, err := mcpproxy.Lock("pay", []mcpproxy.Tool{{Name: "charge", Definition: []byte(`{"name":"charge","inputSchema":{"type":"object"}}`)}})
	require.NoError(t, err)
	require.NoError(t, mcpproxy.WritePins(path, pins))
	got, err := mcpproxy.LoadPins(path)
	require.NoError(t, err)
	require.Equal(t, pins, got)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file left behind")

	// Key order and number spelling do not change a pin; any other change does.
	a, _ := mcpproxy.ToolDigest([]byte(`{"name":"x","inputSchema":{"type":"object","maxItems":1.0}}`))
	b, _ := mcpproxy.ToolDigest([]byte(`{"inputSchema":{"maxItems":1,"type":"object"},"name":"x"}`))
	c, _ := mcpproxy.ToolDigest([]byte(`{"name":"x","description":"new","inputSchema":{"type":"object","maxItems":1}}`))
	require.Equal(t, a, b)
	require.NotEqual(t, a, c)

	require.Error(t, mcpproxy.WritePins(filepath.Join(dir, "no-such-dir", "p.json"), pins))
	_, err = mcpproxy.Lock("pay", []mcpproxy.Tool{{Name: "a", Definition: []byte(`{"name":"a"}`)}, {Name: "a", Definition: []byte(`{"name":"a"}`)}})
	require.ErrorContains(t, err, `lists tool "a" twice`)
	require.Equal(t, "/etc/tf/proxy.pins.json", mcpproxy.DefaultPinsPath("/etc/tf/proxy.yaml"))
}
