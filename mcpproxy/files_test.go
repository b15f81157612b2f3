package mcpproxy_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/policy"
)

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

func TestWritePinsIsAtomicAndRoundTrips(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "p.pins.json")
	pins, err := policy.Lock("pay", []policy.Tool{{Name: "charge", Definition: []byte(`{"name":"charge","inputSchema":{"type":"object"}}`)}})
	require.NoError(t, err)
	require.NoError(t, mcpproxy.WritePins(path, pins))
	got, err := mcpproxy.LoadPins(path)
	require.NoError(t, err)
	require.Equal(t, pins, got)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file left behind")

	// Key order and number spelling do not change a pin; any other change does.
	a, _ := policy.ToolDigest([]byte(`{"name":"x","inputSchema":{"type":"object","maxItems":1.0}}`))
	b, _ := policy.ToolDigest([]byte(`{"inputSchema":{"maxItems":1,"type":"object"},"name":"x"}`))
	c, _ := policy.ToolDigest([]byte(`{"name":"x","description":"new","inputSchema":{"type":"object","maxItems":1}}`))
	require.Equal(t, a, b)
	require.NotEqual(t, a, c)

	require.Error(t, mcpproxy.WritePins(filepath.Join(dir, "no-such-dir", "p.json"), pins))
	_, err = policy.Lock("pay", []policy.Tool{{Name: "a", Definition: []byte(`{"name":"a"}`)}, {Name: "a", Definition: []byte(`{"name":"a"}`)}})
	require.ErrorContains(t, err, `lists tool "a" twice`)
	require.Equal(t, "/etc/tf/proxy.pins.json", mcpproxy.DefaultPinsPath("/etc/tf/proxy.yaml"))
}
