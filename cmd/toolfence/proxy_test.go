package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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

	r = tf(t, nil, "proxy", "--store", store, "--server-id", "mail", "--log-format", "xml", "--", "true")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, `--log-format "xml": want text or json`)
	r = tf(t, nil, "proxy", "--store", store, "--server-id", "mail", "--log-level", "loud", "--", "true")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, `--log-level "loud"`)
	require.NoDirExists(t, store, "nothing written for refused log flags")

	r = tf(t, nil, "proxy", "--store", store, "--server-id", "mail", "--", filepath.Join(dir, "no-such-server"))
	require.Equal(t, exitError, r.code, r.String())
	require.Contains(t, r.stderr, `starting upstream "`+filepath.Join(dir, "no-such-server")+`"`)
	require.NoDirExists(t, store, "nothing written for a command that does not exist")

	shortLease := filepath.Join(dir, "short.yaml")
	require.NoError(t, os.WriteFile(shortLease, []byte("tools:\n  send: {lease: 10ms}\n"), 0o600))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--server-id", "mail", "--timeout", "-1s"}, "--timeout -1s is negative"},
		{[]string{"--server-id", "mail", "--lease", "-2s"}, "--lease -2s is negative"},
		{[]string{"--server-id", "bad id"}, `--server-id: mcpproxy: server id "bad id"`},
		{[]string{"--server-id", "mail", "--config", filepath.Join(dir, "nope.yaml")}, "cannot read the policy file"},
		{[]string{"--server-id", "mail", "--lease", "1ms"}, "--lease 1ms is not longer than the safety margin 50ms"},
		{[]string{"--server-id", "mail", "--config", shortLease}, `tool "send": lease 10ms is not longer than the safety margin 50ms`},
	} {
		r = tf(t, nil, append(append([]string{"proxy", "--store", store}, tc.args...), "--", "true")...)
		require.Equal(t, exitUsage, r.code, r.String())
		require.Contains(t, r.stderr, tc.want)
		require.NoDirExists(t, store, "nothing written for %v", tc.args)
	}
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

// lineWatch is a stderr that keeps everything written and hands the first match of re to
// found.
type lineWatch struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	re    *regexp.Regexp
	found chan string
	sent  bool
}

func (w *lineWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if m := w.re.FindStringSubmatch(w.buf.String()); m != nil && !w.sent {
		w.sent = true
		w.found <- m[1]
	}
	return len(p), nil
}

func (w *lineWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestProxyMetricsAndLogs: `toolfence proxy --metrics 127.0.0.1:0 --log-format json` in
// front of another toolfence (serve --stdio) prints its metrics address on stderr; its
// /metrics, parsed with the Prometheus text parser, counts the protected calls made
// (executed, replayed, an ambiguous isError answer recorded unknown) and has the
// open-residual gauges; stderr has one JSON line for the ambiguous call with its key and
// recovery, and never the arguments or results. stdout carries only the MCP stream.
func TestProxyMetricsAndLogs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	stderr := &lineWatch{re: regexp.MustCompile(`serving metrics at (http://\S+/metrics)`), found: make(chan string, 1)}
	cmd := exec.Command(bin, "proxy", "--store", filepath.Join(dir, "proxy"), "--server-id", "tf",
		"--metrics", "127.0.0.1:0", "--log-format", "json", "--log-level", "info",
		"--", bin, "serve", "--stdio", "--store", filepath.Join(dir, "upstream"))
	cmd.Stderr = stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil)
	s, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	defer s.Close()
	var metricsURL string
	select {
	case metricsURL = <-stderr.found:
	case <-time.After(30 * time.Second):
		t.Fatalf("the proxy did not print its metrics address; stderr: %s", stderr)
	}

	callTool := func(name string, args map[string]any) *mcp.CallToolResult {
		t.Helper()
		res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
		require.NoError(t, err)
		return res
	}
	begin := map[string]any{"task": "run-1", "operation": "charge", "target": "invoice:1", "args": map[string]any{"note": "secret-body"}}
	first := callTool("begin_call", begin)
	require.False(t, first.IsError)
	second := callTool("begin_call", begin)
	require.Equal(t, true, second.Meta["toolfence.dev/replayed"])
	// commit_call without a key: upstream answers isError, which proves nothing → unknown.
	bad := callTool("commit_call", map[string]any{"note": "secret-body"})
	require.True(t, bad.IsError)

	m := (&served{metrics: metricsURL}).scrape(t)
	require.Equal(t, map[string]float64{
		"operation=tf/begin_call,reason=succeeded,result=executed": 1,
		"operation=tf/begin_call,reason=,result=replayed":          1,
		"operation=tf/commit_call,reason=unknown,result=executed":  1,
	}, withoutEmpty(values(m, "toolfence_calls_total")), "toolfence_calls_total counts the proxy's calls")
	require.EqualValues(t, 3, histogramCount(m, "toolfence_ledger_step_duration_seconds", "step", "reserve"))
	require.Equal(t, map[string]float64{"state=unknown": 1}, withoutEmpty(values(m, "toolfence_residuals_open")))
	require.Equal(t, map[string]float64{"": 1}, values(m, "toolfence_ledger_up"))

	var unknown []map[string]any
	for _, line := range strings.Split(stderr.String(), "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "every log line is JSON: %s", line)
		if rec["kind"] == "unknown_outcome" {
			unknown = append(unknown, rec)
		}
	}
	require.Len(t, unknown, 1, "one line for the ambiguous call; stderr: %s", stderr)
	require.Equal(t, "WARN", unknown[0]["level"])
	require.Contains(t, unknown[0]["key"], "tf1_")
	require.Equal(t, "tf/commit_call", unknown[0]["operation"])
	require.NotEmpty(t, unknown[0]["recovery"])
	require.NotContains(t, stderr.String(), "secret-body", "no arguments in the log")
}

// TestProxyBinaryStopsOnSIGTERM: with the host's stdin still open and nothing to read,
// SIGTERM ends the proxy and its upstream with it: a normal end, exit status 0 and no
// warning or error on stderr, as serve's.
func TestProxyBinaryStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command(bin, "proxy", "--store", filepath.Join(dir, "proxy"), "--server-id", "tf", "--",
		bin, "serve", "--stdio", "--store", filepath.Join(dir, "upstream"))
	stderr := &lineWatch{re: regexp.MustCompile(`(context canceled)`), found: make(chan string, 1)}
	cmd.Stderr = stderr
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	defer in.Close()
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	// Serving: an initialize goes through to the upstream and back.
	_, err = in.Write([]byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}` + "\n"))
	require.NoError(t, err)
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, stderr.String())
	require.Contains(t, line, `"serverInfo"`)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "exit status 0 on SIGTERM: %s", stderr.String())
		require.NotContains(t, stderr.String(), "context canceled")
		require.NotRegexp(t, `level=(WARN|ERROR)|toolfence: `, stderr.String())
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("the proxy did not stop on SIGTERM; stderr: %s", stderr.String())
	}
}
