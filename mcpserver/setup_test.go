package mcpserver_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/internal/testkit/crashtest"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// Bearer tokens of the test server: A sees namespace ns-a, B sees ns-b.
const (
	tokA = "token-for-namespace-a-0123456789"
	tokB = "token-for-namespace-b-0123456789"
	nsA  = "ns-a"
	nsB  = "ns-b"
)

// Operations with registered probes: "probed" says succeeded with a result, "probed-fail"
// says failed. Operations without a probe stay open in reconcile.
const (
	opProbed     = "probed"
	opProbedFail = "probed-fail"
	opPanics     = "panics"
)

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

func TestMain(m *testing.M) {
	testkit.RunRole(map[string]func() int{"serve": runServer})
	if crashtest.Role() != "" {
		os.Exit(m.Run()) // a crash child is killed: it cannot pass the leak check
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreCurrent(), goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
			goleak.IgnoreAnyFunction("github.com/dgraph-io/ristretto/v2/z.(*AllocatorPool).freeupAllocators"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// env is one server over a fresh badger ledger with a fake clock, served over HTTP.
type env struct {
	t     *testing.T
	clock *lease.Fake
	led   *badger.Ledger
	ic    *interceptor.Interceptor
	srv   *mcpserver.Server
	ts    *httptest.Server
	url   string
}

func probes() map[string]interceptor.Operation {
	return map[string]interceptor.Operation{
		opProbed: {Probe: func(_ context.Context, r *residual.Residual) (interceptor.ProbeResult, error) {
			return interceptor.ProbeResult{Outcome: residual.Succeeded, Result: []byte(`{"found":"` + r.Target + `"}`), Evidence: "upstream lookup by idempotency key"}, nil
		}},
		opProbedFail: {Probe: func(context.Context, *residual.Residual) (interceptor.ProbeResult, error) {
			return interceptor.ProbeResult{Outcome: residual.Failed, Evidence: "upstream has no such charge"}, nil
		}},
		opPanics: {Classify: func(interceptor.Response, error) residual.State { panic("classifier exploded") }},
	}
}

func setup(t *testing.T, mod func(*mcpserver.Options)) *env {
	t.Helper()
	return setupWith(t, interceptor.Options{}, mod)
}

// setupWith is setup with settings for the namespace-A interceptor (its Namespace and Clock
// are set here).
func setupWith(t *testing.T, cfg interceptor.Options, mod func(*mcpserver.Options)) *env {
	t.Helper()
	clock := lease.NewFake(t0)
	led, err := badger.Open(t.TempDir(), badger.Options{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, led.Close()) })
	cfg.Namespace = nsA
	if cfg.Clock == nil {
		cfg.Clock = clock
	}
	cfg.MaxArgs, cfg.MaxResult = cmp.Or(cfg.MaxArgs, 4<<10), cmp.Or(cfg.MaxResult, 1<<10)
	ic, err := interceptor.New(led, cfg)
	require.NoError(t, err)
	var tokens mcpwire.Tokens
	require.NoError(t, tokens.Add(tokA, nsA))
	require.NoError(t, tokens.Add(tokB, nsB))
	opts := mcpserver.Options{Tokens: tokens, Operations: probes()}
	if mod != nil {
		mod(&opts)
	}
	srv, err := mcpserver.New(ic, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
	})
	return &env{t: t, clock: clock, led: led, ic: ic, srv: srv, ts: ts, url: ts.URL + mcpwire.Path}
}

// protocol eras a client may speak.
const (
	legacy = mcp.ProtocolVersion20251125 // sessions, initialize handshake
	modern = mcp.ProtocolVersion20260728 // stateless
)

// dial connects an mcp-go client over streamable HTTP with token, on the given protocol.
func (e *env) dial(token, version string, opts ...transport.StreamableHTTPCOption) *client.Client {
	e.t.Helper()
	return e.dialURL(e.url, token, version, opts...)
}

func (e *env) dialURL(url, token, version string, opts ...transport.StreamableHTTPCOption) *client.Client {
	e.t.Helper()
	if token != "" {
		opts = append(opts, transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	}
	tr, err := transport.NewStreamableHTTP(url, opts...)
	require.NoError(e.t, err)
	return start(e.t, client.NewClient(tr, client.WithProtocolVersion(version)), version)
}

func start(t *testing.T, c *client.Client, version string) *client.Client {
	t.Helper()
	// Start's context bounds the child process of a stdio transport: it must outlive the test.
	require.NoError(t, c.Start(context.Background()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t.Cleanup(func() { c.Close() })
	var init mcp.InitializeRequest
	init.Params.ClientInfo = mcp.Implementation{Name: "test-agent", Version: "1"}
	res, err := c.Initialize(ctx, init)
	require.NoError(t, err)
	require.Equal(t, version, res.ProtocolVersion)
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func callTool(t *testing.T, c *client.Client, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	var req mcp.CallToolRequest
	req.Params.Name = tool
	req.Params.Arguments = args
	res, err := c.CallTool(ctx(t), req)
	require.NoError(t, err, "%s: protocol error", tool)
	return res
}

func text(res *mcp.CallToolResult) string {
	s := ""
	for _, c := range res.Content {
		if tc, ok := mcp.AsTextContent(c); ok {
			s += tc.Text
		}
	}
	return s
}

// ok calls tool and decodes its structured result, failing on isError.
func ok[T any](t *testing.T, c *client.Client, tool string, args any) T {
	t.Helper()
	res := callTool(t, c, tool, args)
	require.False(t, res.IsError, "%s: unexpected isError: %s", tool, text(res))
	require.NotEmpty(t, res.RawStructuredContent, "%s: no structured content", tool)
	require.NotEmpty(t, text(res), "%s: no text fallback", tool)
	var out T
	require.NoError(t, json.Unmarshal(res.RawStructuredContent, &out))
	return out
}

// fails calls tool, requires an isError result and returns its structured error.
func fails(t *testing.T, c *client.Client, tool string, args any) mcpwire.ErrorInfo {
	t.Helper()
	res := callTool(t, c, tool, args)
	require.True(t, res.IsError, "%s: want isError, got: %s", tool, text(res))
	var out struct {
		Error mcpwire.ErrorInfo `json:"error"`
	}
	require.NoError(t, json.Unmarshal(res.RawStructuredContent, &out), "%s: %s", tool, text(res))
	require.NotEmpty(t, out.Error.Kind)
	require.Contains(t, text(res), out.Error.Message, "the text names the problem")
	return out.Error
}

// snapshot is every residual of ns as JSON, to prove a refused call changed nothing.
func snapshot(t *testing.T, l ledger.Ledger, ns string) string {
	t.Helper()
	var all []*residual.Residual
	cursor := ""
	for {
		page, err := l.List(context.Background(), ledger.ListParams{Namespace: ns, Limit: ledger.MaxListLimit, Cursor: cursor})
		require.NoError(t, err)
		all = append(all, page.Residuals...)
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Key < all[j].Key })
	b, err := json.Marshal(all)
	require.NoError(t, err)
	return string(b)
}

func rawPost(t *testing.T, url, token, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}
