package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// TestProxyLockCheckAndPins: `proxy lock` pins every upstream tool beside the policy, `proxy
// check` prints one line per tool and exits 1 for a problem, and the proxy refuses a
// protected tool whose pin differs while forwarding read-only ones.
func TestProxyLockCheckAndPins(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	upstream := []string{bin, "serve", "--stdio", "--store", filepath.Join(dir, "upstream")}
	policy := filepath.Join(dir, "mail.yaml")
	require.NoError(t, os.WriteFile(policy, []byte("tools:\n  begin_call: {target: [/operation]}\n"), 0o600))

	r := tf(t, nil, append([]string{"proxy", "lock", "--config", policy, "--server-id", "tf", "--"}, upstream...)...)
	require.Equal(t, exitOK, r.code, r.String())
	pinsFile := filepath.Join(dir, "mail.pins.json")
	require.Contains(t, r.stdout, "pinned 7 tool(s) of server tf in "+pinsFile)
	var pins struct {
		ServerID string            `json:"server_id"`
		Tools    map[string]string `json:"tools"`
	}
	data, err := os.ReadFile(pinsFile)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &pins))
	require.Equal(t, "tf", pins.ServerID)
	require.Len(t, pins.Tools, 7)
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, pins.Tools["begin_call"])

	r = tf(t, nil, append([]string{"proxy", "check", "--config", policy, "--server-id", "tf", "--"}, upstream...)...)
	require.Equal(t, exitOK, r.code, r.String())
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 8, "a header and one line per tool:\n%s", r.stdout)
	require.Regexp(t, `(?m)^begin_call\s+protect\s+/operation\s+ok\s+default: not annotated read-only$`, r.stdout)
	require.Regexp(t, `(?m)^commit_call\s+protect\s+digest of arguments\s+ok\s+default: not annotated read-only; warning: no target pointers`, r.stdout)
	require.Regexp(t, `(?m)^list_pending\s+bypass\s+-\s+ok\s+annotated readOnlyHint: true$`, r.stdout, "a pinned tool is checked before it is bypassed")

	// A changed pin: check says so and exits 1; the proxy refuses the tool, forwards the rest.
	pins.Tools["begin_call"] = "sha256:" + strings.Repeat("0", 64)
	data, _ = json.Marshal(pins)
	require.NoError(t, os.WriteFile(pinsFile, data, 0o600))
	r = tf(t, nil, append([]string{"proxy", "check", "--config", policy, "--server-id", "tf", "--"}, upstream...)...)
	require.Equal(t, exitError, r.code, r.String())
	require.Regexp(t, `(?m)^begin_call\s+protect \(refused\)\s+/operation\s+changed\s+.*warning: pin changed: calls are refused until toolfence proxy lock`, r.stdout)
	require.Contains(t, r.stderr, "proxy check: some calls would be refused")

	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil)
	proxy := exec.Command(bin, append([]string{"proxy", "--store", filepath.Join(dir, "proxy"), "--config", policy, "--server-id", "tf", "--"}, upstream...)...)
	s, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: proxy}, nil)
	require.NoError(t, err)
	defer s.Close()
	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "begin_call", Arguments: map[string]any{"operation": "x", "target": "y"}})
	require.NoError(t, err)
	require.True(t, res.IsError)
	raw, _ := json.Marshal(res.Meta["toolfence.dev/error"])
	require.Contains(t, string(raw), `"kind":"pin"`)
	require.Contains(t, res.Content[0].(*mcp.TextContent).Text, "runs `toolfence proxy lock` to pin it again")
	res, err = s.CallTool(t.Context(), &mcp.CallToolParams{Name: "list_pending", Arguments: map[string]any{}})
	require.NoError(t, err)
	require.False(t, res.IsError, "a read-only tool is not checked against pins")
	require.NoError(t, s.Close()) // its upstream holds the upstream store

	// A policy naming a tool the upstream lacks: a problem, exit 1.
	require.NoError(t, os.WriteFile(policy, []byte("tools:\n  send_mail: {target: [/to]}\n"), 0o600))
	r = tf(t, nil, append([]string{"proxy", "check", "--config", policy, "--pins", filepath.Join(dir, "none.json"), "--server-id", "tf", "--"}, upstream...)...)
	require.Equal(t, exitUsage, r.code, "an explicit --pins must exist: %s", r.String())
	require.Contains(t, r.stderr, "none.json")
	r = tf(t, nil, append([]string{"proxy", "check", "--config", policy, "--server-id", "tf", "--"}, upstream...)...)
	require.Equal(t, exitError, r.code, r.String())
	require.Contains(t, r.stdout, `problem: the policy names tool "send_mail", which server "tf" does not list`)
}

// TestProxyRefusesMalformedPinsAndWritesNothing: a malformed pins file, pins of another
// server, or lock/check without what they need are clear errors; no store is created.
func TestProxyRefusesMalformedPinsAndWritesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	pins := filepath.Join(dir, "p.pins.json")
	require.NoError(t, os.WriteFile(pins, []byte(`{"server_id": "mail", "tools": {"send": "md5:abc"}}`), 0o600))
	r := tf(t, nil, "proxy", "--store", store, "--server-id", "mail", "--pins", pins, "--", "true")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, `p.pins.json: mcpproxy: invalid pins: tool "send": pin "md5:abc"`)
	require.NoDirExists(t, store)

	require.NoError(t, os.WriteFile(pins, []byte(`{"server_id": "other", "tools": {}}`), 0o600))
	r = tf(t, nil, "proxy", "--store", store, "--server-id", "mail", "--pins", pins, "--", "true")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, `the pins were locked for server "other", not "mail"`)

	r = tf(t, nil, "proxy", "--store", store, "--server-id", "mail", "--pins", filepath.Join(dir, "missing.json"), "--", "true")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, "missing.json")
	require.NoDirExists(t, store)

	r = tf(t, nil, "proxy", "lock", "--server-id", "mail", "--", "true")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, "give --pins FILE")
	r = tf(t, nil, "proxy", "lock", "--pins", pins, "--", "true")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, "--server-id is required")
	r = tf(t, nil, "proxy", "check", "--server-id", "mail")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, "give the upstream server's command after --")
	r = tf(t, nil, "proxy", "lock", "--pins", filepath.Join(dir, "new.json"), "--server-id", "mail", "--", filepath.Join(dir, "no-such-server"))
	require.Equal(t, exitError, r.code, r.String())
	require.Contains(t, r.stderr, "no-such-server")
	require.NoFileExists(t, filepath.Join(dir, "new.json"), "nothing written when the upstream does not start")

	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("tools:\n  send:\n    probe: {tool: send, found: /f}\n"), 0o600))
	r = tf(t, nil, "proxy", "--store", store, "--server-id", "mail", "--config", bad, "--", "true")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, `bad.yaml: mcpproxy: invalid policy: tool "send": probe: tool "send" is the protected tool itself`)
	require.NoDirExists(t, store)
}

// TestProxyLockReadsThePolicy: lock reads --config before it writes pins beside it: a path
// that does not exist, a malformed policy or one naming a tool the upstream does not list
// is an error, and no pins file is written.
func TestProxyLockReadsThePolicy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	upstream := []string{bin, "serve", "--stdio", "--store", filepath.Join(dir, "upstream")}
	lock := func(policy string) result {
		return tf(t, nil, append([]string{"proxy", "lock", "--config", policy, "--server-id", "tf", "--"}, upstream...)...)
	}

	r := lock(filepath.Join(dir, "typo.yaml"))
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, "cannot read the policy file")
	require.NoFileExists(t, filepath.Join(dir, "typo.pins.json"))

	dup := filepath.Join(dir, "dup.json")
	require.NoError(t, os.WriteFile(dup, []byte(`{"tools": {"begin_call": {"mode": "protect"}, "begin_call": {"mode": "bypass"}}}`), 0o600))
	r = lock(dup)
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, `tools: key "begin_call" is given twice`)
	require.NoFileExists(t, filepath.Join(dir, "dup.pins.json"))

	unknown := filepath.Join(dir, "unknown.yaml")
	require.NoError(t, os.WriteFile(unknown, []byte("tools:\n  send_mail: {mode: protect}\n"), 0o600))
	r = lock(unknown)
	require.Equal(t, exitError, r.code, r.String())
	require.Contains(t, r.stderr, `nothing written: the policy `+unknown+` does not fit the upstream: the policy names tool "send_mail"`)
	require.NoFileExists(t, filepath.Join(dir, "unknown.pins.json"))
}
