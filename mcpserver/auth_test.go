//lint:file-ignore SA1019 these tests cover the legacy protocol paths (logging, GET streams, subscribe) on purpose

package mcpserver_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`

func TestAuthMissingOrWrongTokenIs401(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	for _, tc := range []struct{ name, token, challenge string }{
		{"missing", "", `Bearer realm="toolfence"`},
		{"wrong", "token-nobody-has-0123456789abcdef", `Bearer realm="toolfence", error="invalid_token"`},
		{"other scheme", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, e.url, strings.NewReader(initBody))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			if tc.name == "other scheme" {
				req.Header.Set("Authorization", "Basic "+tokA)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
			if tc.challenge != "" {
				require.Equal(t, tc.challenge, resp.Header.Get("WWW-Authenticate"))
			}
			body, _ := io.ReadAll(resp.Body)
			require.Contains(t, string(body), "bearer token")
		})
	}
	require.Equal(t, http.StatusOK, rawPost(t, e.url, tokA, initBody).StatusCode)

	// Clients see it as an authorization failure, on either protocol era.
	for _, version := range []string{legacy, modern} {
		tr, err := transport.NewStreamableHTTP(e.url, transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer wrong-token-0123456789abcdef"}))
		require.NoError(t, err)
		c := client.NewClient(tr, client.WithProtocolVersion(version))
		require.NoError(t, c.Start(ctx(t)))
		_, err = c.Initialize(ctx(t), mcp.InitializeRequest{})
		require.ErrorIs(t, err, transport.ErrAuthorizationRequired, version)
		c.Close()
	}
	_, err := mcpserver.Dial(ctx(t), e.ts.URL, "wrong-token-0123456789abcdef")
	require.ErrorIs(t, err, ledger.ErrUnauthorized)
	_, err = mcpserver.Dial(ctx(t), e.ts.URL, "")
	require.ErrorIs(t, err, ledger.ErrUnauthorized)
}

// TestNamespaceIsolation: a token of namespace B cannot list, inspect, resolve, reconcile or
// commit what namespace A recorded, and the same call in B gets its own key.
func TestNamespaceIsolation(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	a := e.dial(tokA, legacy)
	b := e.dial(tokB, modern)
	begin := m{"task": "t1", "operation": "charge", "target": "invoice:1", "args": m{"n": 1}, "lease_ms": 1000}
	ra := ok[mcpserver.BeginResult](t, a, "begin_call", begin)
	require.Equal(t, mcpserver.DecisionProceed, ra.Decision)
	require.Equal(t, "unknown", ok[mcpserver.CommitResult](t, a, "commit_call", m{"key": ra.Key, "token": ra.Token, "lease_secret": ra.LeaseSecret, "outcome": "unknown"}).State.String())
	before := snapshot(t, e.led, nsA)

	require.Empty(t, ok[mcpserver.ListResult](t, b, "list_pending", m{}).Residuals)
	require.Empty(t, ok[mcpserver.ListResult](t, b, "list_pending", m{"task": "t1", "state": "unknown"}).Residuals)
	require.Equal(t, mcpwire.KindNotFound, fails(t, b, "inspect_residual", m{"key": ra.Key}).Kind)
	require.Equal(t, mcpwire.KindNotFound, fails(t, b, "resolve_residual", m{"key": ra.Key, "as": "succeeded", "note": "not mine"}).Kind)
	require.Equal(t, mcpwire.KindNotFound, fails(t, b, "reconcile", m{"key": ra.Key}).Kind)
	// Not even with A's secret.
	require.Equal(t, mcpwire.KindNotFound, fails(t, b, "commit_call", m{"key": ra.Key, "token": ra.Token, "lease_secret": ra.LeaseSecret, "outcome": "failed"}).Kind)
	require.Equal(t, mcpwire.KindNotFound, fails(t, b, "renew_lease", m{"key": ra.Key, "token": ra.Token, "lease_secret": ra.LeaseSecret, "lease_ms": 1000}).Kind)
	_, err := b.ReadResource(ctx(t), mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: "toolfence://residuals/" + ra.Key}})
	require.Error(t, err)
	require.Equal(t, before, snapshot(t, e.led, nsA), "namespace B changed nothing in A")

	rb := ok[mcpserver.BeginResult](t, b, "begin_call", begin)
	require.Equal(t, mcpserver.DecisionProceed, rb.Decision, "the same call in B is not blocked by A's residual")
	require.NotEqual(t, ra.Key, rb.Key)
	require.Len(t, ok[mcpserver.ListResult](t, a, "list_pending", m{}).Residuals, 1)
	require.Equal(t, ra.Key, ok[mcpserver.ListResult](t, a, "list_pending", m{}).Residuals[0].Key)
	require.Equal(t, rb.Key, ok[mcpserver.ListResult](t, b, "list_pending", m{}).Residuals[0].Key)
	require.Equal(t, residual.Key(nsB, "t1", "charge", "invoice:1"), rb.Key)
}

// TestNoTokensServesLoopbackOnly: without tokens the handler serves loopback connections in
// the interceptor's namespace, refuses others, and ListenAndServe refuses to bind them.
func TestNoTokensServesLoopbackOnly(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *mcpserver.Options) { o.Tokens = mcpwire.Tokens{} })
	c := e.dial("", legacy)
	r := ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}})
	require.Equal(t, residual.Key(nsA, "t", "o", "x"), r.Key)

	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(initBody))
	req.Header.Set("Content-Type", "application/json")
	req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 7777}))
	e.srv.Handler().ServeHTTP(rec, req)
	require.Equal(t, http.StatusForbidden, rec.Code)

	err := e.srv.ListenAndServe(ctx(t), "0.0.0.0:0", nil)
	require.ErrorIs(t, err, mcpwire.ErrUnsafeBind)
}

// TestListenAndServe serves on a real listener, answers a client, and shuts down when its
// context ends.
func TestListenAndServe(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	sctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- e.srv.ListenAndServe(sctx, "127.0.0.1:0", func(a net.Addr) { addrs <- a }) }()
	addr := <-addrs
	c, err := mcpserver.Dial(ctx(t), "http://"+addr.String(), tokA)
	require.NoError(t, err)
	page, err := c.List(ctx(t), mcpserver.ListPendingInput{})
	require.NoError(t, err)
	require.Empty(t, page.Residuals)
	require.NoError(t, c.Close())

	// A legacy client holding a notification stream must not stall the shutdown.
	e.dialURL("http://"+addr.String()+mcpwire.Path, tokA, legacy, transport.WithContinuousListening())
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("ListenAndServe did not return after its context ended")
	}
}
