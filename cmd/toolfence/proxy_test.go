package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// TestProxyRefusesBadInputAndWritesNothing: a malformed policy, a missing upstream command or
// server id, and an upstream that cannot start are clear errors; the store is not created
// for a refused policy.
func TestProxyRefusesBadInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	bad := filepath.Join(dir, "policy.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"tools": {"send": {"mode": "guard"}}}`), 0o600))
	r := tf(t, nil, "proxy", "--store", store, "--server-id", "mail", "--config", bad, "--", "true")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, `policy.json: mcpproxy: invalid policy: tool "send": mode "guard": want "protect" or "bypass"`)
	require.NoDirExists(t, store, "nothing written for a refused policy")

	require.NoError(t, os.WriteFile(bad, []byte(`{"tools": {"send": {"target": "/to"}}}`), 0o600))
	r = tf(t, nil, "proxy", "--store", store, "--server-id", "mail", "--config", bad, "--", "true")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, "invalid policy")
	require.NoDirExists(t, store)

	r = tf(t, nil, "proxy", "--store", store, "--server-id", "mail")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, "give the upstream server's command after --")
	r = tf(t, nil, "proxy", "--store", store, "--", "true")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, "--server-id is required")

	r = tf(t, nil, "proxy", "--store", store, "--server-id", "mail", "--", filepath.Join(dir, "no-such-server"))
	require.Equal(t, exitError, r.code, r.String())
	require.Contains(t, r.stderr, `starting upstream "`+filepath.Join(dir, "no-such-server")+`"`)
}

// TestProxyBinaryRelaysAnUpstream: the binary in front of another toolfence (serve --stdio,
// an MCP server) lists exactly the upstream's tools to an official Go SDK host and forwards a
// read-only call.
func TestProxyBinaryRelaysAnUpstream(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	upstream := []string{bin, "serve", "--stdio", "--store", filepath.Join(dir, "upstream")}
	connect := func(args ...string) *mcp.ClientSession {
		c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil)
		s, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: exec.Command(args[0], args[1:]...)}, nil)
		require.NoError(t, err)
		return s
	}
	direct := connect(upstream...)
	want, err := direct.ListTools(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, direct.Close())

	s := connect(append([]string{bin, "proxy", "--store", filepath.Join(dir, "proxy"), "--server-id", "tf", "--"}, upstream...)...)
	defer s.Close()
	got, err := s.ListTools(t.Context(), nil)
	require.NoError(t, err)
	w, _ := json.Marshal(want)
	g, _ := json.Marshal(got)
	require.JSONEq(t, string(w), string(g))
	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "list_pending", Arguments: map[string]any{}})
	require.NoError(t, err)
	require.False(t, res.IsError)
	require.Nil(t, res.Meta["toolfence.dev/replayed"])
}
