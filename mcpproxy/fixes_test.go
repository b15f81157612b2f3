package mcpproxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/httpserve"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/residual"
)

// rawEnd is one side of an in-memory JSON-RPC connection, read continuously.
type rawEnd struct {
	conn mcp.Connection
	in   chan jsonrpc.Message
}

func newRaw(t *testing.T, tr mcp.Transport) *rawEnd {
	c, err := tr.Connect(context.Background())
	require.NoError(t, err)
	return rawOf(c)
}

// rawOf reads c continuously.
func rawOf(c mcp.Connection) *rawEnd {
	r := &rawEnd{conn: c, in: make(chan jsonrpc.Message, 100)}
	go func() {
		for {
			m, err := c.Read(context.Background())
			if err != nil {
				close(r.in)
				return
			}
			r.in <- m
		}
	}()
	return r
}

func (r *rawEnd) next(t *testing.T) jsonrpc.Message {
	t.Helper()
	select {
	case m, ok := <-r.in:
		require.True(t, ok, "connection closed")
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("timeout waiting for a message")
	}
	return nil
}

func (r *rawEnd) nextReq(t *testing.T) *jsonrpc.Request {
	t.Helper()
	for {
		if q, ok := r.next(t).(*jsonrpc.Request); ok && q.IsCall() {
			return q
		}
	}
}

func (r *rawEnd) answer(t *testing.T, id jsonrpc.ID, result string) {
	require.NoError(t, r.conn.Write(context.Background(), &jsonrpc.Response{ID: id, Result: json.RawMessage(result)}))
}

func (r *rawEnd) send(t *testing.T, id any, method, params string) {
	jid, err := jsonrpc.MakeID(id)
	require.NoError(t, err)
	require.NoError(t, r.conn.Write(context.Background(), &jsonrpc.Request{ID: jid, Method: method, Params: json.RawMessage(params)}))
}

type rig struct {
	host, up *rawEnd
	ic       *interceptor.Interceptor
	l        *badger.Ledger
	cfg      mcpproxy.Options
	wrapDown func(mcp.Connection) mcp.Connection // nil, or what the proxy's end of the host connection is wrapped in
}

// newRig serves one host session through a proxy over a fresh store; the interceptor's
// and ledger's clock is clock (nil: the real one).
func newRig(t *testing.T, cfg mcpproxy.Options, clock lease.Clock) *rig {
	return newRigWrapped(t, cfg, clock, nil)
}

// newRigWrapped is newRig with the proxy's end of the host connection wrapped in wrapDown
// (nil: not wrapped).
func newRigWrapped(t *testing.T, cfg mcpproxy.Options, clock lease.Clock, wrapDown func(mcp.Connection) mcp.Connection) *rig {
	l, err := badger.Open(filepath.Join(t.TempDir(), "store"), badger.Options{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	ic, err := interceptor.New(l, interceptor.Options{LeaseTTL: 5 * time.Second, Clock: clock})
	require.NoError(t, err)
	cfg.ServerID = "fx"
	r := &rig{ic: ic, l: l, cfg: cfg, wrapDown: wrapDown}
	r.reconnect(t)
	return r
}

// reconnect serves a new host session (a new upstream session) over the same store.
func (r *rig) reconnect(t *testing.T) {
	p, err := mcpproxy.New(r.ic, r.cfg)
	require.NoError(t, err)
	hostT, downT := mcp.NewInMemoryTransports()
	upT, fakeT := mcp.NewInMemoryTransports()
	down, err := downT.Connect(context.Background())
	require.NoError(t, err)
	up, err := upT.Connect(context.Background())
	require.NoError(t, err)
	if r.wrapDown != nil {
		down = r.wrapDown(down)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = p.Serve(ctx, down, up) }()
	r.host, r.up = newRaw(t, hostT), newRaw(t, fakeT)
}

func (r *rig) residuals(t *testing.T) []*residual.Residual {
	page, err := r.l.List(context.Background(), ledger.ListParams{Namespace: "default"})
	require.NoError(t, err)
	return page.Residuals
}

// hostResult is the host's next message, a tools/call result with the given id.
func (r *rig) hostResult(t *testing.T, id any) string {
	resp, ok := r.host.next(t).(*jsonrpc.Response)
	require.True(t, ok)
	require.EqualValues(t, id, resp.ID.Raw())
	require.Nil(t, resp.Error)
	return string(resp.Result)
}

// listed answers the upstream's next request, which must be tools/list, with tools.
func (r *rig) listed(t *testing.T, tools ...string) {
	list := r.up.nextReq(t)
	require.Equal(t, "tools/list", list.Method)
	r.up.answer(t, list.ID, `{"tools":[`+strings.Join(tools, ",")+`]}`)
}

// nothingSentUpstream sends the host's ping and checks it is the next thing upstream gets.
func (r *rig) nothingSentUpstream(t *testing.T, id float64) {
	r.host.send(t, id, "ping", `{}`)
	next := r.up.nextReq(t)
	require.Equal(t, "ping", next.Method, "nothing else was sent upstream before the ping: %s", next.Params)
	r.up.answer(t, next.ID, `{}`)
	r.host.next(t)
}

const chargeDef = `{"name":"charge","inputSchema":{"type":"object"}}`
const readDef = `{"name":"read","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}`
const findDef = `{"name":"find","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}`

var proxyID = regexp.MustCompile(`^toolfence-proxy:[0-9a-f]{16}:[0-9]+$`)

// A host request whose id is in the proxy's own id space is refused (-32600) and not
// relayed, so its answer can never be taken for the answer of the proxy's guarded call.
func TestProxyRefusesHostRequestIDsInItsOwnIDSpace(t *testing.T) {
	r := newRig(t, mcpproxy.Options{}, nil)
	r.host.send(t, float64(1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	r.listed(t, chargeDef, readDef)
	guarded := r.up.nextReq(t)
	require.Equal(t, "tools/call", guarded.Method)
	gid := guarded.ID.Raw().(string)
	require.Regexp(t, proxyID, gid, "the proxy's ids carry a random per-session part")

	for _, id := range []string{gid, "toolfence-proxy:2"} {
		r.host.send(t, id, "tools/call", `{"name":"read","arguments":{}}`)
		resp := r.host.next(t).(*jsonrpc.Response)
		require.Equal(t, id, resp.ID.Raw())
		require.NotNil(t, resp.Error)
		var we *jsonrpc.Error
		require.ErrorAs(t, resp.Error, &we)
		require.EqualValues(t, -32600, we.Code)
		require.Contains(t, we.Message, "reserved")
	}
	// Nor may the host cancel the proxy's own request upstream.
	require.NoError(t, r.host.conn.Write(context.Background(), &jsonrpc.Request{Method: "notifications/cancelled", Params: json.RawMessage(`{"requestId":"` + gid + `"}`)}))
	r.nothingSentUpstream(t, 7)

	// The guarded call is answered by upstream's own answer only.
	r.up.answer(t, guarded.ID, `{"content":[{"type":"text","text":"charged"}]}`)
	require.Contains(t, r.hostResult(t, 1), "charged")
	rs := r.residuals(t)
	require.Len(t, rs, 1)
	require.Equal(t, residual.Succeeded, rs[0].State)
}

// A pinned tool whose definition changed to readOnlyHint: true is refused (kind pin), not
// bypassed; an explicit bypass in the policy file relays it.
func TestProxyRefusesAPinnedToolThatTurnedReadOnly(t *testing.T) {
	old, err := policy.ToolDigest(json.RawMessage(chargeDef))
	require.NoError(t, err)
	pins := &policy.Pins{ServerID: "fx", Tools: map[string]string{"charge": old}}
	const turned = `{"name":"charge","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}`

	r := newRig(t, mcpproxy.Options{Pins: pins}, nil)
	r.host.send(t, float64(1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	r.listed(t, turned, readDef)
	res := r.hostResult(t, 1)
	require.Contains(t, res, `"isError":true`)
	require.Contains(t, res, `"kind":"pin"`)
	require.Contains(t, res, "differs from its pin")
	// A read-only tool without a pin is still bypassed.
	r.host.send(t, float64(2), "tools/call", `{"name":"read","arguments":{}}`)
	fwd := r.up.nextReq(t)
	require.EqualValues(t, 2, fwd.ID.Raw(), "relayed untouched")
	r.up.answer(t, fwd.ID, `{"content":[]}`)
	r.host.next(t)
	r.nothingSentUpstream(t, 3)
	require.Empty(t, r.residuals(t))

	// A pinned tool that vanished is refused too (it is protected: not in the list).
	r2 := newRig(t, mcpproxy.Options{Pins: pins}, nil)
	r2.host.send(t, float64(1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	r2.listed(t, readDef)
	require.Contains(t, r2.hostResult(t, 1), "is no longer listed by the upstream")

	pol, err := policy.Parse([]byte(`{"tools":{"charge":{"mode":"bypass"}}}`))
	require.NoError(t, err)
	r3 := newRig(t, mcpproxy.Options{Pins: pins, Policy: pol}, nil)
	r3.host.send(t, float64(1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	r3.listed(t, turned)
	fwd = r3.up.nextReq(t)
	require.EqualValues(t, 1, fwd.ID.Raw(), "the policy file's explicit bypass relays it")
}

// A tool list fetched while list_changed arrives is not cached over the reset: the next
// call lists the tools again.
func TestProxyDoesNotCacheAToolListFetchedAcrossListChanged(t *testing.T) {
	r := newRig(t, mcpproxy.Options{}, nil)
	r.host.send(t, float64(1), "tools/call", `{"name":"read","arguments":{}}`)
	list := r.up.nextReq(t)
	require.Equal(t, "tools/list", list.Method)
	require.NoError(t, r.up.conn.Write(context.Background(), &jsonrpc.Request{Method: "notifications/tools/list_changed"}))
	r.up.answer(t, list.ID, `{"tools":[`+readDef+`]}`)
	fwd := r.up.nextReq(t)
	require.EqualValues(t, 1, fwd.ID.Raw())
	r.up.answer(t, fwd.ID, `{"content":[]}`)
	for {
		if resp, ok := r.host.next(t).(*jsonrpc.Response); ok {
			require.EqualValues(t, 1, resp.ID.Raw())
			break
		}
	}
	r.host.send(t, float64(2), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	again := r.up.nextReq(t)
	require.Equal(t, "tools/list", again.Method, "the list fetched across list_changed was not kept")
}

const probedCharge = `{"tools":{"charge":{"mode":"protect","target":["/order"],"timeout":"300ms",
	"probe":{"tool":"find","arguments":{"order":"/order"},"found":"/found"%s}}}}`

// An attempt that timed out may still be running upstream: a probe's "not found" before
// not_found_after (default: the tool's timeout) has passed since it began leaves the call
// refused, nothing dispatched; after it, "not found" settles it failed and the call runs.
func TestProxyTrustsAProbesNotFoundOnlyAfterNotFoundAfter(t *testing.T) {
	for _, c := range []struct {
		name, extra string
		wait        time.Duration
	}{
		{"default: the tool's timeout", "", 300 * time.Millisecond},
		{"not_found_after", `,"not_found_after":"1h"`, time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			pol, err := policy.Parse([]byte(strings.Replace(probedCharge, "%s", c.extra, 1)))
			require.NoError(t, err)
			clock := lease.NewFake(time.Now())
			r := newRig(t, mcpproxy.Options{Policy: pol}, clock)
			r.host.send(t, float64(1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
			r.listed(t, chargeDef, findDef)
			first := r.up.nextReq(t)
			require.Equal(t, "tools/call", first.Method)
			require.Contains(t, r.hostResult(t, 1), "unknown") // upstream is slow: the proxy timed out

			r.host.send(t, float64(2), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
			probe := r.up.nextReq(t)
			require.Contains(t, string(probe.Params), `"find"`)
			r.up.answer(t, probe.ID, `{"content":[],"structuredContent":{"found":false}}`)
			res := r.hostResult(t, 2)
			require.Contains(t, res, `"isError":true`)
			require.Contains(t, res, "the earlier attempt may still be running upstream; a probe's not-found is trusted from "+
				clock.Now().Add(c.wait).UTC().Format(time.RFC3339Nano))
			r.nothingSentUpstream(t, 3)
			require.Equal(t, residual.Unknown, r.residuals(t)[0].State)

			clock.Advance(c.wait - time.Millisecond)
			r.host.send(t, float64(4), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
			probe = r.up.nextReq(t)
			r.up.answer(t, probe.ID, `{"content":[],"structuredContent":{"found":false}}`)
			require.Contains(t, r.hostResult(t, 4), "may still be running upstream")
			r.nothingSentUpstream(t, 5)

			clock.Advance(time.Millisecond)
			r.host.send(t, float64(6), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
			probe = r.up.nextReq(t)
			r.up.answer(t, probe.ID, `{"content":[],"structuredContent":{"found":false}}`)
			second := r.up.nextReq(t)
			require.Equal(t, "tools/call", second.Method)
			require.Contains(t, string(second.Params), `"charge"`)
			r.up.answer(t, second.ID, `{"content":[{"type":"text","text":"charged"}]}`)
			require.Contains(t, r.hostResult(t, 6), "charged")
		})
	}
}

// A probe that finds the effect settles at once, whenever the attempt began.
func TestProxyTrustsAProbesFoundAtOnce(t *testing.T) {
	pol, err := policy.Parse([]byte(strings.Replace(probedCharge, "%s", "", 1)))
	require.NoError(t, err)
	r := newRig(t, mcpproxy.Options{Policy: pol}, lease.NewFake(time.Now()))
	r.host.send(t, float64(1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	r.listed(t, chargeDef, findDef)
	first := r.up.nextReq(t)
	r.up.answer(t, first.ID, `{"isError":true,"content":[{"type":"text","text":"boom"}]}`)
	require.Contains(t, r.hostResult(t, 1), "unknown")
	r.host.send(t, float64(2), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	probe := r.up.nextReq(t)
	r.up.answer(t, probe.ID, `{"content":[],"structuredContent":{"found":true}}`)
	res := r.hostResult(t, 2)
	require.NotContains(t, res, `"isError":true`)
	require.Contains(t, res, "toolfence.dev/replayed")
	require.Equal(t, residual.Succeeded, r.residuals(t)[0].State)
}

// A task id is asked about only in the upstream session that issued it: after a reconnect
// the call stays open with a note; tasks/get must answer about the same task.
func TestProxySettlesATaskOnlyFromItsUpstreamSession(t *testing.T) {
	r := newRig(t, mcpproxy.Options{}, nil)
	r.host.send(t, float64(1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	r.listed(t, chargeDef)
	first := r.up.nextReq(t)
	r.up.answer(t, first.ID, `{"task":{"taskId":"t-1","status":"working"}}`)
	require.Contains(t, r.hostResult(t, 1), "awaiting_upstream")
	rs := r.residuals(t)
	require.Len(t, rs, 1)
	require.Regexp(t, `^[0-9a-f]{16}/t-1$`, rs[0].Handle)

	// Same session: tasks/get answering about another task settles nothing.
	r.host.send(t, float64(2), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	get := r.up.nextReq(t)
	require.Equal(t, "tasks/get", get.Method)
	require.JSONEq(t, `{"taskId":"t-1"}`, string(get.Params))
	r.up.answer(t, get.ID, `{"taskId":"t-2","status":"completed"}`)
	res := r.hostResult(t, 2)
	require.Contains(t, res, "awaiting_upstream")
	require.Contains(t, res, `the answer is about task \"t-2\", not this one`)
	r.nothingSentUpstream(t, 3)

	// A new upstream session (another proxy process, a reconnect) never asks about t-1.
	r.reconnect(t)
	r.host.send(t, float64(1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	r.listed(t, chargeDef)
	res = r.hostResult(t, 1)
	require.Contains(t, res, "awaiting_upstream")
	require.Contains(t, res, "belongs to an earlier upstream session")
	require.Contains(t, res, "toolfence resolve")
	r.nothingSentUpstream(t, 2)
	require.Equal(t, residual.Accepted, r.residuals(t)[0].State)
}

// proxy --http without tokens: a browser's cross-site "simple" POST (text/plain), a
// foreign Origin, and a batch carrying initialize are refused before any session opens.
func TestHTTPProxyRefusesCrossSiteRequests(t *testing.T) {
	l, err := badger.Open(filepath.Join(t.TempDir(), "store"), badger.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	ic, err := interceptor.New(l, interceptor.Options{LeaseTTL: 5 * time.Second})
	require.NoError(t, err)
	p, err := mcpproxy.New(ic, mcpproxy.Options{ServerID: "fx"})
	require.NoError(t, err)
	dialed := make(chan struct{}, 10)
	h, err := p.NewHTTPServer(mcpproxy.HTTPOptions{Dial: func(ctx context.Context) (mcp.Connection, io.Closer, error) {
		dialed <- struct{}{}
		upT, _ := mcp.NewInMemoryTransports()
		up, err := upT.Connect(ctx)
		return up, io.NopCloser(nil), err
	}})
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := make(chan net.Addr, 1)
	go func() { _ = h.ListenAndServe(ctx, "127.0.0.1:0", httpserve.Limits{}, func(a net.Addr) { addr <- a }) }()
	url := "http://" + (<-addr).String() + "/mcp"
	const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	batch := `[` + initialize + `,{"jsonrpc":"2.0","method":"notifications/initialized"},
	{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"charge","arguments":{"order":"A"}}}]`
	for _, c := range []struct {
		name, body, ctype, origin string
		status                    int
	}{
		{"text/plain", batch, "text/plain;charset=UTF-8", "", http.StatusUnsupportedMediaType},
		{"no content type", initialize, "", "", http.StatusUnsupportedMediaType},
		{"foreign origin", initialize, "application/json", "https://evil.example", http.StatusForbidden},
		{"null origin", initialize, "application/json", "null", http.StatusForbidden},
		{"batch with initialize", batch, "application/json", "", http.StatusBadRequest},
		{"batch with initialize, loopback origin", batch, "application/json", "http://localhost:3000", http.StatusBadRequest},
	} {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(c.body))
		require.NoError(t, err)
		if c.ctype != "" {
			req.Header.Set("Content-Type", c.ctype)
		}
		req.Header.Set("Accept", "application/json, text/event-stream")
		if c.origin != "" {
			req.Header.Set("Origin", c.origin)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err, c.name)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, c.status, resp.StatusCode, "%s: %s", c.name, body)
	}
	require.Empty(t, dialed, "no upstream session was opened")
}

// proxy check reports a pinned tool that turned read-only as refused, like the proxy.
func TestCheckRefusesAPinnedToolThatTurnedReadOnly(t *testing.T) {
	old, err := policy.ToolDigest(json.RawMessage(chargeDef))
	require.NoError(t, err)
	pins := &policy.Pins{ServerID: "fx", Tools: map[string]string{"charge": old}}
	turned := policy.Tool{Name: "charge", Definition: json.RawMessage(`{"name":"charge","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}`)}
	rep := policy.Check("fx", nil, pins, []policy.Tool{turned, {Name: "read", Definition: json.RawMessage(readDef)}})
	require.Len(t, rep.Tools, 2)
	require.False(t, rep.Tools[0].Protect)
	require.True(t, rep.Tools[0].Refused)
	require.Equal(t, "changed", rep.Tools[0].Pin)
	require.False(t, rep.Tools[1].Refused, "a read-only tool without a pin is bypassed unchecked")
	require.Empty(t, rep.Tools[1].Pin)
}

// A tools/call whose params hold a key the proxy reads twice, or one that differs from it
// only in case, is refused (invalid_input) and nothing is sent upstream: encoding/json reads
// {"name":"read","Name":"charge"} as charge, a case-sensitive upstream as read (and the
// other way round), so the proxy's verdict could be about another tool than the one run.
// Before and after the tool list is cached (the inline relay of bypassed calls).
func TestProxyRefusesAmbiguousCallParams(t *testing.T) {
	r := newRig(t, mcpproxy.Options{}, nil)
	refused := func(id float64, params string) {
		t.Helper()
		r.host.send(t, id, "tools/call", params)
		res := r.hostResult(t, id)
		require.Contains(t, res, `"isError":true`, params)
		require.Contains(t, res, "invalid_input", params)
		require.Contains(t, res, "nothing was sent upstream", params)
		r.nothingSentUpstream(t, 100+id)
	}
	ok := func(id float64) {
		t.Helper()
		relayed := r.up.nextReq(t)
		require.Equal(t, "tools/call", relayed.Method)
		require.JSONEq(t, `{"name":"read","arguments":{}}`, string(relayed.Params))
		r.up.answer(t, relayed.ID, `{"content":[{"type":"text","text":"ok"}]}`)
		require.Contains(t, r.hostResult(t, id), `"ok"`)
	}

	// Before the tool list is fetched: refused at once.
	refused(1, `{"name":"charge","Name":"read","arguments":{"order":"A"}}`)
	// The same call with its keys written once and as they are goes through.
	r.host.send(t, float64(2), "tools/call", `{"name":"read","arguments":{}}`)
	r.listed(t, chargeDef, readDef)
	ok(2)
	// With the list cached (bypassed calls are relayed inline): refused all the same.
	for i, params := range []string{
		`{"name":"read","Name":"charge","arguments":{}}`,
		`{"name":"read","arguments":{},"Arguments":{"order":"A"}}`,
		`{"name":"read","arguments":{},"_META":{}}`,
		`{"name":"charge","name":"read","arguments":{}}`,
	} {
		refused(float64(3+i), params)
	}
	require.Empty(t, r.residuals(t))
	r.host.send(t, float64(9), "tools/call", `{"name":"read","arguments":{}}`)
	ok(9)
}
