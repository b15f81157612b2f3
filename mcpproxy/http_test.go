//lint:file-ignore SA1019 these tests cover the legacy protocol paths (logging, GET streams, subscribe) on purpose

package mcpproxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/client"
	mcpgotransport "github.com/mark3labs/mcp-go/client/transport"
	mcpgomcp "github.com/mark3labs/mcp-go/mcp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// world is an in-process proxy on a badger store of its own, with an effects and a mode
// file for its upstreams.
type world struct {
	t             *testing.T
	dir           string
	l             ledger.Ledger
	p             *mcpproxy.Proxy
	effects, mode string
}

func newWorld(t *testing.T, policy string) *world {
	t.Helper()
	dir := t.TempDir()
	l, err := badger.Open(filepath.Join(dir, "store"), badger.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	ic, err := interceptor.New(l, interceptor.Options{LeaseTTL: 5 * time.Second})
	require.NoError(t, err)
	cfg := mcpproxy.Options{ServerID: "fixture", Timeout: 20 * time.Second, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
	if policy != "" {
		path := filepath.Join(dir, "policy.json")
		require.NoError(t, os.WriteFile(path, []byte(policy), 0o600))
		cfg.Policy, err = mcpproxy.LoadPolicy(path)
		require.NoError(t, err)
	}
	p, err := mcpproxy.New(ic, cfg)
	require.NoError(t, err)
	w := &world{t: t, dir: dir, l: l, p: p, effects: filepath.Join(dir, "effects"), mode: filepath.Join(dir, "mode")}
	w.setMode("ok")
	return w
}

func (w *world) setMode(m string) { require.NoError(w.t, os.WriteFile(w.mode, []byte(m), 0o600)) }

func (w *world) effectCount() int {
	data, err := os.ReadFile(w.effects)
	if os.IsNotExist(err) {
		return 0
	}
	require.NoError(w.t, err)
	return strings.Count(string(data), "\n")
}

func (w *world) residuals(ns string) []*residual.Residual {
	page, err := w.l.List(context.Background(), ledger.ListParams{Namespace: ns})
	require.NoError(w.t, err)
	return page.Residuals
}

// host relays an official Go SDK client (in memory) to up through the proxy; the session
// ends with the test.
func (w *world) host(up mcp.Connection, opts *mcp.ClientOptions) *mcp.ClientSession {
	w.t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	down, err := st.Connect(context.Background())
	require.NoError(w.t, err)
	served := make(chan error, 1)
	go func() { served <- w.p.Serve(context.Background(), down, up) }()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, opts).Connect(context.Background(), ct, nil)
	require.NoError(w.t, err)
	w.t.Cleanup(func() {
		_ = s.Close()
		select {
		case <-served:
		case <-time.After(30 * time.Second):
			w.t.Error("the proxy's session did not end")
		}
	})
	return s
}

// stdioDial starts the stdio fixture (this test binary, role upstream) for each session
// and sends its pid on pids.
func (w *world) stdioDial(pids chan<- int) mcpproxy.Dialer {
	return func(ctx context.Context) (mcp.Connection, io.Closer, error) {
		up, err := transport.StartUpstream(ctx, []string{"env", "TOOLFENCE_TEST_ROLE=upstream", "TF_EFFECTS=" + w.effects, "TF_MODE=" + w.mode, os.Args[0]}, os.Stderr)
		if err != nil {
			return nil, nil, err
		}
		if pids != nil {
			pids <- up.Pid()
		}
		return up.Conn(), up, nil
	}
}

// serveHTTP serves w's proxy over HTTP with tokens (token → namespace) and returns its
// URL and server.
func (w *world) serveHTTP(opts mcpproxy.HTTPOptions, tokens map[string]string) (string, *mcpproxy.HTTPServer) {
	w.t.Helper()
	for tok, ns := range tokens {
		require.NoError(w.t, opts.Tokens.Add(tok, ns))
	}
	h, err := w.p.NewHTTPServer(opts)
	require.NoError(w.t, err)
	srv := httptest.NewServer(h)
	w.t.Cleanup(srv.Close)
	w.t.Cleanup(func() { require.NoError(w.t, h.Close()) })
	return srv.URL, h
}

// bearerTransport adds a bearer token to every request.
type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// legacy makes a Go SDK host speak 2025-11-25 (sessions), which these tests are about; a
// host left to choose speaks 2026-07-28 to an upstream that does (stateless_test.go).
var legacy = &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"}

// sdkHost connects an official Go SDK client to url with token, in a 2025-11-25 session.
func sdkHost(t *testing.T, url, token string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "sdk-host", Version: "1"}, opts).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearerTransport{token}}, MaxRetries: -1}, legacy)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// mcpgoHost connects an mcp-go client to url with token.
func mcpgoHost(t *testing.T, url, token string) *mcpgo.Client {
	t.Helper()
	tr, err := mcpgotransport.NewStreamableHTTP(url, mcpgotransport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	require.NoError(t, err)
	c := mcpgo.NewClient(tr)
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var init mcpgomcp.InitializeRequest
	init.Params.ClientInfo = mcpgomcp.Implementation{Name: "mcp-go-host", Version: "1"}
	init.Params.ProtocolVersion = mcpgomcp.LATEST_LEGACY_PROTOCOL_VERSION
	_, err = c.Initialize(ctx, init)
	require.NoError(t, err)
	return c
}

const (
	tokenA = "token-aaaaaaaaaaaaaaaaaaaaaaaa"
	tokenB = "token-bbbbbbbbbbbbbbbbbbbbbbbb"
)

// TestHTTPDownstreamGoSDKAndMCPGoHosts: a Go SDK host and an mcp-go host reach a stdio
// upstream (a child process per session) over HTTP with a token: the tool list is
// upstream's exactly, the first call runs once and the other host's identical call is a
// replay.
func TestHTTPDownstreamGoSDKAndMCPGoHosts(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	pids := make(chan int, 8)
	url, _ := w.serveHTTP(mcpproxy.HTTPOptions{Dial: w.stdioDial(pids)}, map[string]string{tokenA: "default"})

	direct, err := mcp.NewClient(&mcp.Implementation{Name: "direct", Version: "1"}, nil).Connect(context.Background(),
		&mcp.CommandTransport{Command: commandWithEnv(os.Args[0], "TOOLFENCE_TEST_ROLE=upstream", "TF_EFFECTS="+w.effects, "TF_MODE="+w.mode)}, nil)
	require.NoError(t, err)
	want, err := direct.ListTools(context.Background(), nil)
	require.NoError(t, err)
	require.NoError(t, direct.Close())

	s := sdkHost(t, url, tokenA, nil)
	got, err := s.ListTools(context.Background(), nil)
	require.NoError(t, err)
	// The tools, not the envelope: a direct stdio client and an HTTP one negotiate
	// different protocol versions, whose results carry different extra fields.
	wj, _ := json.Marshal(want.Tools)
	gj, _ := json.Marshal(got.Tools)
	require.JSONEq(t, string(wj), string(gj), "the tool list is upstream's")

	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	first := call(t, s, "append", args, nil)
	require.False(t, first.IsError, text(first))
	require.Equal(t, "appended hello to inbox:bob", text(first))

	c := mcpgoHost(t, url, tokenA)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := c.ListTools(ctx, mcpgomcp.ListToolsRequest{})
	require.NoError(t, err)
	mdirect, err := mcpgo.NewStdioMCPClient(os.Args[0], []string{"TOOLFENCE_TEST_ROLE=upstream", "TF_EFFECTS=" + w.effects, "TF_MODE=" + w.mode})
	require.NoError(t, err)
	var init mcpgomcp.InitializeRequest
	init.Params.ClientInfo = mcpgomcp.Implementation{Name: "direct", Version: "1"}
	init.Params.ProtocolVersion = mcpgomcp.LATEST_LEGACY_PROTOCOL_VERSION
	_, err = mdirect.Initialize(ctx, init)
	require.NoError(t, err)
	mwant, err := mdirect.ListTools(ctx, mcpgomcp.ListToolsRequest{})
	require.NoError(t, err)
	require.NoError(t, mdirect.Close())
	wj, _ = json.Marshal(mwant.Tools)
	gj, _ = json.Marshal(list.Tools)
	require.JSONEq(t, string(wj), string(gj), "the mcp-go host sees upstream's tool list")
	require.NotEmpty(t, list.Tools)
	var req mcpgomcp.CallToolRequest
	req.Params.Name, req.Params.Arguments = "append", args
	res, err := c.CallTool(ctx, req)
	require.NoError(t, err)
	require.False(t, res.IsError)
	require.Equal(t, true, res.Meta.AdditionalFields[mcpwire.MetaReplayed], "the mcp-go host's identical call is a replay")
	require.Equal(t, 1, w.effectCount())
	require.Len(t, pids, 2, "one upstream child per session")
}

// TestHTTPDownstreamNamespaceIsolation: two tokens of two namespaces make the same call:
// it runs once per namespace, and each namespace holds only its own residual.
func TestHTTPDownstreamNamespaceIsolation(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	url, _ := w.serveHTTP(mcpproxy.HTTPOptions{Dial: w.stdioDial(nil)}, map[string]string{tokenA: "team-a", tokenB: "team-b"})
	a, b := sdkHost(t, url, tokenA, nil), sdkHost(t, url, tokenB, nil)
	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	require.False(t, call(t, a, "append", args, nil).IsError)
	require.Equal(t, 1, w.effectCount())
	require.False(t, call(t, b, "append", args, nil).IsError)
	require.Equal(t, 2, w.effectCount(), "another namespace is another key space")
	require.Equal(t, true, call(t, a, "append", args, nil).Meta[mcpwire.MetaReplayed])
	require.Equal(t, true, call(t, b, "append", args, nil).Meta[mcpwire.MetaReplayed])
	require.Equal(t, 2, w.effectCount())
	for _, ns := range []string{"team-a", "team-b"} {
		rs := w.residuals(ns)
		require.Len(t, rs, 1, ns)
		require.Equal(t, ns, rs[0].Namespace)
		require.Equal(t, residual.Succeeded, rs[0].State)
	}
	require.Empty(t, w.residuals("default"))
}

// TestHTTPDownstreamWrongTokenIs401: a missing or unknown token gets 401 with a message
// saying which, and opens no session (no upstream child).
func TestHTTPDownstreamWrongTokenIs401(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	pids := make(chan int, 2)
	url, h := w.serveHTTP(mcpproxy.HTTPOptions{Dial: w.stdioDial(pids)}, map[string]string{tokenA: "default"})
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	for token, want := range map[string]string{"": "missing bearer token", "token-wrong-wrong-wrong-wrong": "invalid bearer token"} {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(init))
		require.NoError(t, err)
		req.Header.Set("Accept", "application/json, text/event-stream")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		require.Contains(t, string(body), want)
		require.Contains(t, resp.Header.Get("WWW-Authenticate"), "Bearer")
	}
	_, err := mcp.NewClient(&mcp.Implementation{Name: "x", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearerTransport{"token-wrong-wrong-wrong-wrong"}}, MaxRetries: -1}, legacy)
	require.Error(t, err, "a Go SDK host with a wrong token cannot connect")
	require.Zero(t, h.Sessions())
	require.Empty(t, pids, "no upstream was started")
}

// TestHTTPDownstreamSessionEndKillsTheChild: a host that ends its session (DELETE), and a
// session idle past --session-idle on the server's clock, each end their upstream child.
func TestHTTPDownstreamSessionEndKillsTheChild(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	pids := make(chan int, 4)
	ended := make(chan string, 4)
	clock := lease.NewFake(time.Now())
	url, h := w.serveHTTP(mcpproxy.HTTPOptions{Dial: w.stdioDial(pids), Clock: clock, SessionIdle: time.Hour,
		OnSessionEnd: func(id string) { ended <- id }}, map[string]string{tokenA: "default"})
	gone := func(pid int) {
		t.Helper()
		select {
		case <-ended:
		case <-time.After(30 * time.Second):
			t.Fatal("the session did not end")
		}
		require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "the upstream child %d is gone", pid)
	}

	s := sdkHost(t, url, tokenA, nil)
	require.False(t, call(t, s, "read", nil, nil).IsError)
	pid := <-pids
	require.NoError(t, syscall.Kill(pid, 0), "the child runs while the session lives")
	require.NoError(t, s.Close()) // DELETE
	gone(pid)

	// An mcp-go host (no notification stream) that goes quiet: its session expires.
	c := mcpgoHost(t, url, tokenA)
	pid = <-pids
	_, err := c.ListTools(context.Background(), mcpgomcp.ListToolsRequest{})
	require.NoError(t, err)
	require.Zero(t, h.Sweep(), "not idle yet")
	// A request of the host may still be finishing (its end marks the session active at
	// the clock's time then): advance until the sweep sees an hour of quiet.
	require.Eventually(t, func() bool {
		clock.Advance(time.Hour)
		return h.Sweep() == 1
	}, 10*time.Second, 10*time.Millisecond)
	gone(pid)
	_, err = c.ListTools(context.Background(), mcpgomcp.ListToolsRequest{})
	require.Error(t, err, "the expired session is unknown")
	require.Zero(t, h.Sessions())
}

// TestHTTPDownstreamSessionCap: at --max-sessions, a token's new session ends its least
// recently used idle one.
func TestHTTPDownstreamSessionCap(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	ended := make(chan string, 4)
	url, h := w.serveHTTP(mcpproxy.HTTPOptions{Dial: w.stdioDial(nil), MaxSessions: 1,
		OnSessionEnd: func(id string) { ended <- id }}, map[string]string{tokenA: "default"})
	mcpgoHost(t, url, tokenA)
	second := mcpgoHost(t, url, tokenA)
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the first session was not ended")
	}
	require.Equal(t, 1, h.Sessions())
	_, err := second.ListTools(context.Background(), mcpgomcp.ListToolsRequest{})
	require.NoError(t, err)
}

// TestHTTPEndToEndCancellation: a host over HTTP cancels a protected call that an HTTP
// upstream runs and never answers: the cancellation reaches the call, whose outcome is
// unknown; the next call is refused and nothing runs twice.
func TestHTTPEndToEndCancellation(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	up := newHTTPUpstream(t, w.effects, w.mode)
	url, _ := w.serveHTTP(mcpproxy.HTTPOptions{Dial: func(ctx context.Context) (mcp.Connection, io.Closer, error) {
		c, err := transport.DialUpstream(ctx, up.srv.URL, nil)
		return c, c, err
	}}, map[string]string{tokenA: "default"})
	progress := make(chan struct{}, 1)
	s := sdkHost(t, url, tokenA, &mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
		progress <- struct{}{}
	}})
	w.setMode("hang")
	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "append", Arguments: args, Meta: mcp.Meta{"progressToken": 7}})
		done <- err
	}()
	select {
	case <-progress: // the effect is written; the progress notification followed its token
	case <-time.After(30 * time.Second):
		t.Fatal("no progress notification")
	}
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Eventually(t, func() bool {
		rs := w.residuals("default")
		return len(rs) == 1 && rs[0].State == residual.Unknown
	}, 30*time.Second, 20*time.Millisecond, "the cancelled call is recorded unknown")
	w.setMode("ok")
	res := call(t, s, "append", args, nil)
	require.True(t, res.IsError)
	require.Equal(t, string(interceptor.UnknownOutcome), errorKind(t, res))
	require.Equal(t, 1, w.effectCount())
}

// commandWithEnv is exec.Command(name) with env added to this process's environment.
func commandWithEnv(name string, env ...string) *exec.Cmd {
	cmd := exec.Command(name)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	return cmd
}

// TestHTTPNotificationsReachHosts: over HTTP on both sides, the upstream's logging,
// list_changed and progress notifications reach a Go SDK host (which holds a notification
// stream) and an mcp-go host (which holds none: they ride its request streams).
func TestHTTPNotificationsReachHosts(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	up := newHTTPUpstream(t, w.effects, w.mode)
	url, _ := w.serveHTTP(mcpproxy.HTTPOptions{Dial: func(ctx context.Context) (mcp.Connection, io.Closer, error) {
		c, err := transport.DialUpstream(ctx, up.srv.URL, nil)
		return c, c, err
	}}, map[string]string{tokenA: "default"})
	// wait returns once ch has given want; what it gives meanwhile is kept for later waits
	// (notifications of one call may come in any order).
	seen := map[<-chan string]map[string]bool{}
	wait := func(ch <-chan string, want string) {
		t.Helper()
		if seen[ch] == nil {
			seen[ch] = map[string]bool{}
		}
		timeout := time.After(30 * time.Second)
		for !seen[ch][want] {
			select {
			case got := <-ch:
				seen[ch][got] = true
			case <-timeout:
				t.Fatalf("the host did not get %s (got %v)", want, seen[ch])
			}
		}
	}

	sdk := make(chan string, 16)
	s := sdkHost(t, url, tokenA, &mcp.ClientOptions{
		LoggingMessageHandler:  func(_ context.Context, r *mcp.LoggingMessageRequest) { sdk <- fmt.Sprint("log:", r.Params.Data) },
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { sdk <- "list_changed" },
	})
	require.NoError(t, s.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "info"}))
	require.Equal(t, "notified", text(call(t, s, "notify", nil, nil)))
	wait(sdk, "log:log from upstream")
	wait(sdk, "list_changed")

	got := make(chan string, 64)
	c := mcpgoHost(t, url, tokenA)
	c.OnNotification(func(n mcpgomcp.JSONRPCNotification) {
		switch n.Method {
		case "notifications/message":
			got <- fmt.Sprint("log:", n.Params.AdditionalFields["data"])
		case "notifications/progress":
			got <- fmt.Sprint("progress:", n.Params.AdditionalFields["message"])
		default:
			got <- n.Method
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, c.SetLevel(ctx, mcpgomcp.SetLevelRequest{Params: mcpgomcp.SetLevelParams{Level: mcpgomcp.LoggingLevelInfo}}))
	var req mcpgomcp.CallToolRequest
	req.Params.Name, req.Params.Arguments = "append", map[string]any{"target": "inbox:bob", "text": "hello"}
	req.Params.Meta = &mcpgomcp.Meta{ProgressToken: "p-7"}
	res, err := c.CallTool(ctx, req)
	require.NoError(t, err)
	require.False(t, res.IsError)
	wait(got, "progress:effect written")
	req = mcpgomcp.CallToolRequest{}
	req.Params.Name = "notify"
	_, err = c.CallTool(ctx, req)
	require.NoError(t, err)
	wait(got, "log:log from upstream")
	// list_changed comes outside any call (the upstream sends it a little later): it waits
	// for the host's next request stream, which carries it before its answer.
	req.Params.Name = "read"
	for !seen[got]["notifications/tools/list_changed"] {
		_, err = c.CallTool(ctx, req)
		require.NoError(t, err)
	drain:
		for {
			select {
			case m := <-got:
				seen[got][m] = true
			default:
				break drain
			}
		}
	}
}

// TestHTTPDownstreamLoopbackOnlyWithoutTokens: without tokens, a request whose Host is not
// a loopback name (DNS rebinding) is refused.
func TestHTTPDownstreamLoopbackOnlyWithoutTokens(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	url, h := w.serveHTTP(mcpproxy.HTTPOptions{Dial: w.stdioDial(nil)}, nil)
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(init))
	require.NoError(t, err)
	req.Host = "evil.example:80"
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Contains(t, string(body), "loopback host name")
	require.Zero(t, h.Sessions())
	s := sdkHost(t, url, "", nil) // 127.0.0.1: served
	require.False(t, call(t, s, "read", nil, nil).IsError)
}

// TestHTTPDownstreamJSONOnlyHost: a host that accepts only application/json gets each
// answer as one JSON body, its notifications 202, and DELETE ends its session.
func TestHTTPDownstreamJSONOnlyHost(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	ended := make(chan string, 1)
	url, _ := w.serveHTTP(mcpproxy.HTTPOptions{Dial: w.stdioDial(nil), OnSessionEnd: func(id string) { ended <- id }},
		map[string]string{tokenA: "default"})
	post := func(session, method, body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tokenA)
		req.Header.Set("Accept", "application/json")
		req.Header.Set("Content-Type", "application/json")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, body := post("", http.MethodPost, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	session := resp.Header.Get("Mcp-Session-Id")
	require.NotEmpty(t, session)
	var init struct {
		ID     int `json:"id"`
		Result struct {
			ServerInfo struct{ Name string } `json:"serverInfo"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &init), body)
	require.Equal(t, 1, init.ID)
	require.Equal(t, "fixture", init.Result.ServerInfo.Name)

	resp, body = post(session, http.MethodPost, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	require.Equal(t, http.StatusAccepted, resp.StatusCode, body)
	resp, body = post(session, http.MethodPost, `{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"append","arguments":{"target":"inbox:bob","text":"hi"}}}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.JSONEq(t, `{"jsonrpc":"2.0","id":"c1","result":{"content":[{"type":"text","text":"appended hi to inbox:bob"}]}}`, body)
	require.Equal(t, 1, w.effectCount())

	resp, body = post("tf-proxy-unknown", http.MethodPost, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	resp, _ = post(session, http.MethodDelete, "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	select {
	case id := <-ended:
		require.Equal(t, session, id)
	case <-time.After(30 * time.Second):
		t.Fatal("DELETE did not end the session")
	}
	resp, body = post(session, http.MethodPost, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, body)
}

// TestHTTPServerCloseStopsEverything: after hosts used the HTTP server (a stdio and an
// HTTP upstream), Close ends every session and no goroutine of the proxy is left.
// Not parallel: it counts goroutines.
func TestHTTPServerCloseStopsEverything(t *testing.T) {
	w := newWorld(t, "")
	up := newHTTPUpstream(t, w.effects, w.mode)
	ignore := goleak.IgnoreCurrent()
	for _, dial := range []mcpproxy.Dialer{w.stdioDial(nil), func(ctx context.Context) (mcp.Connection, io.Closer, error) {
		c, err := transport.DialUpstream(ctx, up.srv.URL, nil)
		return c, c, err
	}} {
		var tokens mcpwire.Tokens
		require.NoError(t, tokens.Add(tokenA, "default"))
		h, err := w.p.NewHTTPServer(mcpproxy.HTTPOptions{Dial: dial, Tokens: tokens})
		require.NoError(t, err)
		srv := httptest.NewServer(h)
		tr := &http.Transport{}
		s, err := mcp.NewClient(&mcp.Implementation{Name: "h", Version: "1"}, nil).Connect(context.Background(),
			&mcp.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: &http.Client{Transport: bearerOver{tokenA, tr}}, MaxRetries: -1}, legacy)
		require.NoError(t, err)
		require.False(t, call(t, s, "append", map[string]any{"target": "t", "text": "x"}, nil).IsError)
		require.NoError(t, h.Close(), "Close with a live session")
		require.Zero(t, h.Sessions())
		_ = s.Close()
		srv.Close()
		tr.CloseIdleConnections()
	}
	up.srv.CloseClientConnections()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	goleak.VerifyNone(t, ignore)
}

type bearerOver struct {
	token string
	rt    http.RoundTripper
}

func (b bearerOver) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

// TestHTTPDownstreamSessionEndKillsTheProcessGroup: a child that left a process of its own
// behind (in its process group) has it killed too when its session ends.
func TestHTTPDownstreamSessionEndKillsTheProcessGroup(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	pidFile := filepath.Join(w.dir, "grandchild")
	ended := make(chan string, 1)
	url, _ := w.serveHTTP(mcpproxy.HTTPOptions{
		Dial: func(ctx context.Context) (mcp.Connection, io.Closer, error) {
			up, err := transport.StartUpstream(ctx, []string{"sh", "-c", `sleep 300 & echo $! > "$0"; exec env TOOLFENCE_TEST_ROLE=upstream TF_EFFECTS="$1" TF_MODE="$2" "$3"`,
				pidFile, w.effects, w.mode, os.Args[0]}, os.Stderr)
			if err != nil {
				return nil, nil, err
			}
			return up.Conn(), up, nil
		},
		OnSessionEnd: func(id string) { ended <- id },
	}, map[string]string{tokenA: "default"})
	s := sdkHost(t, url, tokenA, nil)
	require.False(t, call(t, s, "read", nil, nil).IsError)
	raw, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	var pid int
	_, err = fmt.Sscan(string(raw), &pid)
	require.NoError(t, err)
	require.True(t, alive(pid), "the grandchild runs while the session lives")
	require.NoError(t, s.Close())
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the session did not end")
	}
	// SIGKILL is delivered asynchronously, and the grandchild is no child of ours to wait for.
	require.Eventually(t, func() bool { return !alive(pid) }, 10*time.Second, 10*time.Millisecond,
		"the grandchild %d was killed with the process group", pid)
}

// alive reports whether pid runs (a zombie, killed and not yet reaped by its new parent,
// does not).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses: "pid (comm) S ...".
	rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
	return !strings.HasPrefix(strings.TrimSpace(rest), "Z")
}
