package mcpproxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpproxy"
)

// limitRig serves a proxy over HTTP whose upstream sessions are in-memory connections the
// test answers itself: each dial sends the upstream's end on ups. ended gets one value
// each time ServeHTTP returned (its slots are released by then).
type limitRig struct {
	url   string
	h     *mcpproxy.HTTPServer
	ups   chan *rawEnd
	ended chan struct{}
}

func newLimitRig(t *testing.T, opts mcpproxy.HTTPOptions, tokens map[string]string) *limitRig {
	t.Helper()
	return newLimitRigOf(t, newWorld(t, "").p, opts, tokens)
}

// newLimitRigOf is newLimitRig serving p.
func newLimitRigOf(t *testing.T, p *mcpproxy.Proxy, opts mcpproxy.HTTPOptions, tokens map[string]string) *limitRig {
	t.Helper()
	r := &limitRig{ups: make(chan *rawEnd, 8), ended: make(chan struct{}, 64)}
	opts.Dial = func(ctx context.Context) (mcp.Connection, io.Closer, error) {
		upT, fakeT := mcp.NewInMemoryTransports()
		up, err := upT.Connect(ctx)
		if err != nil {
			return nil, nil, err
		}
		r.ups <- newRaw(t, fakeT)
		return up, up, nil
	}
	for tok, ns := range tokens {
		require.NoError(t, opts.Tokens.Add(tok, ns))
	}
	h, err := p.NewHTTPServer(opts)
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		h.ServeHTTP(rw, req)
		r.ended <- struct{}{}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { require.NoError(t, h.Close()) })
	r.url, r.h = srv.URL, h
	return r
}

type answer struct {
	status int
	header http.Header
	body   string
}

// post sends body as token in session (none: "") accepting accept, and returns the answer
// once its body is read and its handler has returned.
func (r *limitRig) post(t *testing.T, token, session, accept, body string) answer {
	t.Helper()
	a := <-r.postAsync(t, token, session, accept, body)
	<-r.ended
	return a
}

// postAsync is post without waiting: the answer arrives on the channel once its body is
// read (receive from ended after it to know its handler returned).
func (r *limitRig) postAsync(t *testing.T, token, session, accept, body string) <-chan answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", accept)
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
	}
	out := make(chan answer, 1)
	go func() {
		// A request the proxy should have refused but relayed waits for an answer that
		// never comes: it fails after a while instead of hanging the test.
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			out <- answer{body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
	}()
	return out
}

// initialize opens a session of token whose upstream is the next dialled one, answered by
// the test, and returns its id and upstream end.
func (r *limitRig) initialize(t *testing.T, token string) (string, *rawEnd) {
	t.Helper()
	pending := r.postAsync(t, token, "", "application/json",
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`)
	up := <-r.ups
	init := up.nextReq(t)
	require.Equal(t, "initialize", init.Method)
	up.answer(t, init.ID, `{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"fake","version":"1"}}`)
	a := <-pending
	<-r.ended
	require.Equal(t, http.StatusOK, a.status, a.body)
	session := a.header.Get("Mcp-Session-Id")
	require.NotEmpty(t, session)
	return session, up
}

// ping sends a ping in session and checks it is the next request upstream gets (so nothing
// else was relayed before it), answers it, and checks the host gets the answer.
func (r *limitRig) ping(t *testing.T, token, session string, up *rawEnd, id string) {
	t.Helper()
	pending := r.postAsync(t, token, session, "application/json", `{"jsonrpc":"2.0","id":"`+id+`","method":"ping"}`)
	next := up.nextReq(t)
	require.Equal(t, "ping", next.Method, "nothing else was relayed upstream before the ping: %s", next.Params)
	up.answer(t, next.ID, `{}`)
	a := <-pending
	<-r.ended
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.JSONEq(t, `{"jsonrpc":"2.0","id":"`+id+`","result":{}}`, a.body)
}

// rpcError is the JSON-RPC error of a refusal's body.
func rpcError(t *testing.T, body string) (int64, string) {
	t.Helper()
	var m struct {
		Error *struct {
			Code    int64  `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &m), body)
	require.NotNil(t, m.Error, body)
	return m.Error.Code, m.Error.Message
}

// TestHTTPDownstreamJSONShapeBounded: a POST whose JSON nests deeper than MaxDepth, or
// holds more than MaxValues values, gets 400 with a JSON-RPC invalid-request error naming
// the bound, before it is decoded: an initialize opens no upstream session, a tools/call in
// a session is not relayed (the next thing upstream gets is the host's following ping).
func TestHTTPDownstreamJSONShapeBounded(t *testing.T) {
	t.Parallel()
	r := newLimitRig(t, mcpproxy.HTTPOptions{MaxDepth: 8, MaxValues: 50}, map[string]string{tokenA: "default"})
	deepArgs := `{"a":` + strings.Repeat("[", 8) + strings.Repeat("]", 8) + `}` // 9 levels on its own
	manyArgs := `{"a":[` + strings.Repeat("1,", 60) + `1]}`
	refused := func(body, names string) {
		t.Helper()
		a := r.post(t, tokenA, "", "application/json", body)
		require.Equal(t, http.StatusBadRequest, a.status, a.body)
		code, msg := rpcError(t, a.body)
		require.Equal(t, int64(-32600), code, a.body)
		require.Contains(t, msg, names)
		require.Contains(t, msg, "nothing was relayed")
	}
	initWith := func(extra string) string {
		return `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"x":` + extra + `},"clientInfo":{"name":"x","version":"1"}}}`
	}
	refused(initWith(deepArgs), "nests more than 8 levels deep")
	refused(initWith(manyArgs), "holds more than 50 values")
	require.Empty(t, r.ups, "no upstream session was opened for a refused initialize")
	require.Zero(t, r.h.Sessions())

	session, up := r.initialize(t, tokenA)
	call := func(args string) string {
		return `{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"append","arguments":` + args + `}}`
	}
	for _, c := range []struct{ body, names string }{{call(deepArgs), "levels deep"}, {call(manyArgs), "more than 50 values"}} {
		a := r.post(t, tokenA, session, "application/json", c.body)
		require.Equal(t, http.StatusBadRequest, a.status, a.body)
		code, msg := rpcError(t, a.body)
		require.Equal(t, int64(-32600), code)
		require.Contains(t, msg, c.names)
	}
	r.ping(t, tokenA, session, up, "after-refusals")
	require.Empty(t, r.ups)
}

// TestHTTPDownstreamInFlightBounded: with MaxInFlight 1, a token's POST while its streamed
// POST waits for upstream gets 429 with Retry-After and a JSON-RPC busy error, and is not
// relayed; another token has its own slot; once the first answer ends, the token is served
// again.
func TestHTTPDownstreamInFlightBounded(t *testing.T) {
	t.Parallel()
	r := newLimitRig(t, mcpproxy.HTTPOptions{MaxInFlight: 1}, map[string]string{tokenA: "default", tokenB: "other"})
	sessionA, upA := r.initialize(t, tokenA)

	// The first request streams (SSE) until upstream answers, holding the token's slot.
	first := r.postAsync(t, tokenA, sessionA, "application/json, text/event-stream", `{"jsonrpc":"2.0","id":"first","method":"ping"}`)
	held := upA.nextReq(t)
	require.Equal(t, "ping", held.Method)

	busy := r.post(t, tokenA, sessionA, "application/json", `{"jsonrpc":"2.0","id":"second","method":"ping"}`)
	require.Equal(t, http.StatusTooManyRequests, busy.status, busy.body)
	require.Equal(t, "1", busy.header.Get("Retry-After"))
	require.Equal(t, "application/json", busy.header.Get("Content-Type"))
	code, msg := rpcError(t, busy.body)
	require.Equal(t, int64(-32000), code)
	require.True(t, strings.HasPrefix(msg, "toolfence proxy: busy: "), msg)
	require.Contains(t, msg, "this token has 1 requests in progress")
	var data struct {
		Error struct {
			Data struct {
				RetryAfterMS int64 `json:"retry_after_ms"`
			} `json:"data"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(busy.body), &data))
	require.EqualValues(t, 1000, data.Error.Data.RetryAfterMS, "as serve's busy answer says it")
	require.Equal(t, 1, r.h.InFlight())

	// Another token is served meanwhile: the limit is per token.
	sessionB, upB := r.initialize(t, tokenB)
	r.ping(t, tokenB, sessionB, upB, "b")

	upA.answer(t, held.ID, `{}`)
	a := <-first
	<-r.ended
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Contains(t, a.body, `"id":"first"`)
	require.Zero(t, r.h.InFlight(), "the slot is released when the answer ends")

	// The refused ping never reached upstream: the next request there is this one.
	r.ping(t, tokenA, sessionA, upA, "third")
}

// TestHTTPDownstreamInFlightTotalBounded: MaxInFlightTotal caps POSTs over all tokens.
func TestHTTPDownstreamInFlightTotalBounded(t *testing.T) {
	t.Parallel()
	r := newLimitRig(t, mcpproxy.HTTPOptions{MaxInFlightTotal: 1}, map[string]string{tokenA: "default", tokenB: "other"})
	sessionA, upA := r.initialize(t, tokenA)
	first := r.postAsync(t, tokenA, sessionA, "application/json", `{"jsonrpc":"2.0","id":"first","method":"ping"}`)
	held := upA.nextReq(t)

	busy := r.post(t, tokenB, "", "application/json",
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`)
	require.Equal(t, http.StatusTooManyRequests, busy.status, busy.body)
	require.Equal(t, "1", busy.header.Get("Retry-After"))
	code, msg := rpcError(t, busy.body)
	require.Equal(t, int64(-32000), code)
	require.Contains(t, msg, "toolfence proxy: busy: 1 requests are in progress on this server")
	require.Empty(t, r.ups, "no upstream session was opened for the refused initialize")

	upA.answer(t, held.ID, `{}`)
	require.Equal(t, http.StatusOK, (<-first).status)
	<-r.ended
	sessionB, upB := r.initialize(t, tokenB)
	r.ping(t, tokenB, sessionB, upB, "b")
}

// TestHTTPOptionsRefuseNegativeBounds: a negative JSON or in-flight bound is refused.
func TestHTTPOptionsRefuseNegativeBounds(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	dial := func(context.Context) (mcp.Connection, io.Closer, error) { return nil, nil, io.EOF }
	for _, o := range []mcpproxy.HTTPOptions{{MaxDepth: -1}, {MaxValues: -1}, {MaxInFlight: -1}, {MaxInFlightTotal: -1}} {
		o.Dial = dial
		_, err := w.p.NewHTTPServer(o)
		require.ErrorContains(t, err, "MaxDepth, MaxValues, MaxInFlight and MaxInFlightTotal must not be negative")
	}
}
