package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
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

// TestProxyHTTPUsage: the upstream and HTTP flags are checked before anything is opened.
func TestProxyHTTPUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	base := []string{"proxy", "--store", store, "--server-id", "mail"}
	with := func(extra ...string) []string { return append(append([]string{}, base...), extra...) }
	fails(t, exitUsage, []string{"give one upstream: --upstream URL or a command after --, not both"}, with("--upstream", "http://127.0.0.1:1/mcp", "--", "true")...)
	fails(t, exitUsage, []string{"give the upstream server's command after --", "--upstream URL"}, base...)
	fails(t, exitUsage, []string{"--header applies to --upstream URL only"}, with("--header", "X-Key=sk-1234567890", "--", "true")...)
	fails(t, exitUsage, []string{`--upstream: mcpproxy: upstream URL: scheme "ftp": want http or https`}, with("--upstream", "ftp://example.com/mcp")...)
	r := fails(t, exitUsage, []string{"--header: mcpproxy: header 1: want NAME=VALUE"}, with("--upstream", "http://127.0.0.1:1/mcp", "--header", "sk-1234567890")...)
	require.NotContains(t, r.stderr, "sk-1234567890", "a header value is never printed")
	r = fails(t, exitUsage, []string{`header 2 (X-Key): the value holds characters`}, with("--upstream", "http://127.0.0.1:1/mcp", "--header", "A=b", "--header", "X-Key=sk-12\x01")...)
	require.NotContains(t, r.stderr, "sk-12")
	fails(t, exitUsage, []string{"--token-file applies to --http only"}, with("--token-file", "x", "--", "true")...)
	fails(t, exitUsage, []string{"non-loopback address without a bearer token"}, with("--http", "0.0.0.0:0", "--", "true")...)
	fails(t, exitUsage, []string{"--max-sessions must be positive"}, with("--http", "127.0.0.1:0", "--max-sessions", "0", "--", "true")...)
	fails(t, exitUsage, []string{"--session-idle must be positive"}, with("--http", "127.0.0.1:0", "--session-idle", "0s", "--", "true")...)
	fails(t, exitUsage, []string{"--max-children applies to a stdio upstream (-- CMD) only"}, with("--http", "127.0.0.1:0", "--max-children", "4", "--upstream", "http://127.0.0.1:1/mcp")...)
	for _, flag := range []string{"--max-depth", "--max-values", "--max-inflight", "--max-inflight-total", "--max-children"} {
		fails(t, exitUsage, []string{flag + " must be positive"}, with("--http", "127.0.0.1:0", flag, "0", "--", "true")...)
		fails(t, exitUsage, []string{flag + " must be positive"}, with("--http", "127.0.0.1:0", flag, "-1", "--", "true")...)
	}
	tokens := filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte(serveToken+"\n"), 0o644))
	fails(t, exitUsage, []string{"other users may read it"}, with("--http", "127.0.0.1:0", "--token-file", tokens, "--", "true")...)
	fails(t, exitError, []string{`starting upstream "` + filepath.Join(dir, "nope") + `"`}, with("--http", "127.0.0.1:0", "--", filepath.Join(dir, "nope"))...)
	require.NoDirExists(t, store, "nothing written for refused flags")
}

// startProc runs the binary with args, returns the URL it reports on stderr ("serving MCP
// at URL ") and all of its stderr; it is killed when the test ends.
func startProc(t *testing.T, args ...string) (*exec.Cmd, string, *lockedBuf) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	all := &lockedBuf{}
	addr := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`serving MCP at (http://\S+) `)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			all.add(sc.Text())
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	select {
	case url := <-addr:
		return cmd, url, all
	case <-time.After(30 * time.Second):
		t.Fatalf("toolfence %v did not report its address; stderr: %s", args, all)
		return nil, "", nil
	}
}

type lockedBuf struct {
	mu    sync.Mutex
	lines []string
}

func (b *lockedBuf) add(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, s)
}

func (b *lockedBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}

type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

func httpHost(t *testing.T, url, token string) (*mcp.ClientSession, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer(token)}, MaxRetries: -1}, nil)
	if err == nil {
		t.Cleanup(func() { _ = s.Close() })
	}
	return s, err
}

func toolsJSON(t *testing.T, s *mcp.ClientSession) string {
	t.Helper()
	res, err := s.ListTools(t.Context(), nil)
	require.NoError(t, err)
	b, err := json.Marshal(res.Tools)
	require.NoError(t, err)
	return string(b)
}

var beginArgs = map[string]any{"task": "run-1", "operation": "charge", "target": "invoice:1", "args": map[string]any{}}

// TestProxyBinaryHTTPUpstream: `toolfence proxy --upstream URL --header` in front of
// `toolfence serve --http` (which wants a bearer token: the header must reach it) relays an
// official Go SDK host over stdio: the tool list is the upstream's, the same protected call
// twice runs once. With a wrong key, the host's initialize fails and the key is not printed.
func TestProxyBinaryHTTPUpstream(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, upURL, _ := teamServe(t)
	direct, err := httpHost(t, upURL, serveToken)
	require.NoError(t, err)
	want := toolsJSON(t, direct)

	connect := func(key string, stderr io.Writer) (*mcp.ClientSession, error) {
		cmd := exec.Command(bin, "proxy", "--store", filepath.Join(dir, "proxy"), "--server-id", "tf",
			"--upstream", upURL, "--header", "Authorization=Bearer "+key)
		cmd.Stderr = stderr
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		return mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	}
	bad := &lockedWriter{}
	_, err = connect("wrong-key-wrong-key-wrong-key", bad)
	require.Error(t, err, "the upstream refuses a wrong key")
	require.NotContains(t, bad.String(), "wrong-key-wrong-key")

	s, err := connect(serveToken, os.Stderr)
	require.NoError(t, err)
	defer s.Close()
	require.JSONEq(t, want, toolsJSON(t, s))
	first, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "begin_call", Arguments: beginArgs})
	require.NoError(t, err)
	require.False(t, first.IsError)
	require.Nil(t, first.Meta["toolfence.dev/replayed"])
	second, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "begin_call", Arguments: beginArgs})
	require.NoError(t, err)
	require.Equal(t, true, second.Meta["toolfence.dev/replayed"], "the second call is a replay, not sent upstream")
}

type lockedWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestProxyBinaryHTTPDownstream: `toolfence proxy --http ADDR --token-file F -- CMD` serves
// an official Go SDK host over HTTP with its token: the tool list is the stdio upstream's,
// the same protected call twice runs once; a wrong token gets 401.
func TestProxyBinaryHTTPDownstream(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	const token = "proxy-http-token-0123456789abcdef"
	require.NoError(t, os.WriteFile(tokens, []byte(token+" team\n"), 0o600))
	upstream := []string{bin, "serve", "--stdio", "--store", filepath.Join(dir, "upstream")}
	proc, url, stderr := startProc(t, append([]string{"proxy", "--store", filepath.Join(dir, "proxy"), "--server-id", "tf",
		"--http", "127.0.0.1:0", "--token-file", tokens, "--"}, upstream...)...)
	require.True(t, strings.HasSuffix(url, "/mcp"), url)

	_, err := httpHost(t, url, "not-the-token-not-the-token")
	require.Error(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Contains(t, string(body), "missing bearer token")

	s, err := httpHost(t, url, token)
	require.NoError(t, err, "stderr: %s", stderr)
	direct, err := mcp.NewClient(&mcp.Implementation{Name: "direct", Version: "1"}, nil).Connect(t.Context(),
		&mcp.CommandTransport{Command: exec.Command(bin, "serve", "--stdio", "--store", filepath.Join(dir, "direct"))}, nil)
	require.NoError(t, err)
	want := toolsJSON(t, direct)
	require.NoError(t, direct.Close())
	require.JSONEq(t, want, toolsJSON(t, s))
	first, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "begin_call", Arguments: beginArgs})
	require.NoError(t, err)
	require.False(t, first.IsError)
	second, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "begin_call", Arguments: beginArgs})
	require.NoError(t, err)
	require.Equal(t, true, second.Meta["toolfence.dev/replayed"])
	require.NoError(t, s.Close())

	// Stopped, the proxy releases its store: the residual is in the token's namespace.
	require.NoError(t, proc.Process.Signal(syscall.SIGTERM))
	require.NoError(t, proc.Wait(), "stderr: %s", stderr)
	r := tf(t, nil, "ls", "--store", filepath.Join(dir, "proxy"), "--namespace", "team", "--json", "--all")
	require.Equal(t, 0, r.code, r.String())
	require.Contains(t, r.stdout, "tf/begin_call")
	r = tf(t, nil, "ls", "--store", filepath.Join(dir, "proxy"), "--json", "--all")
	require.Equal(t, 0, r.code, r.String())
	require.NotContains(t, r.stdout, "tf/begin_call", "nothing in the default namespace")
}

// TestProxyBinaryHTTPJSONBounds: proxy --http passes --max-depth and --max-values on: a POST
// past either gets 400 with a JSON-RPC invalid-request error naming the bound, and no
// upstream child is started for it.
func TestProxyBinaryHTTPJSONBounds(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	// The upstream would leave a file behind if it were ever started.
	_, url, stderr := startProc(t, "proxy", "--store", filepath.Join(dir, "proxy"), "--server-id", "tf",
		"--http", "127.0.0.1:0", "--max-depth", "3", "--max-values", "12", "--", "sh", "-c", "touch "+started)
	post := func(capabilities string) (int, string) {
		body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":` +
			capabilities + `,"clientInfo":{"name":"x","version":"1"}}}`
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err, "stderr: %s", stderr)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct{ capabilities, names string }{
		{`{"a":[[1]]}`, "the request's JSON nests more than 3 levels deep"},
		// The initialize around them holds 9 values (its objects and commas), these 4.
		{`{"a":1,"b":2,"c":3,"d":4}`, "the request's JSON holds more than 12 values"},
	} {
		status, body := post(c.capabilities)
		require.Equal(t, http.StatusBadRequest, status, body)
		var rpc struct {
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &rpc), body)
		require.Equal(t, -32600, rpc.Error.Code, body)
		require.Contains(t, rpc.Error.Message, c.names)
	}
	require.NoFileExists(t, started, "no upstream was started for a refused initialize")
}
