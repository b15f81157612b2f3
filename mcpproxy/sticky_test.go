package mcpproxy_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpwire"
)

const writeDef = `{"name":"write","inputSchema":{"type":"object"}}`
const writeReadOnlyDef = `{"name":"write","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}`

// oneProxy is one Proxy over a fresh store, serving any number of host sessions.
type oneProxy struct {
	p    *mcpproxy.Proxy
	logs *lockedBuffer
}

func newOneProxy(t *testing.T) *oneProxy {
	l, err := badger.Open(filepath.Join(t.TempDir(), "store"), badger.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	ic, err := interceptor.New(l, interceptor.Options{LeaseTTL: 5 * time.Second})
	require.NoError(t, err)
	logs := &lockedBuffer{}
	p, err := mcpproxy.New(ic, mcpproxy.Options{ServerID: "fx", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	return &oneProxy{p: p, logs: logs}
}

// session serves a new host session of the proxy. It returns both raw ends, the context
// cancel ending it and a channel with Serve's return.
func (o *oneProxy) session(t *testing.T) (host, up *rawEnd, cancel context.CancelFunc, served chan error) {
	hostT, downT := mcp.NewInMemoryTransports()
	upT, fakeT := mcp.NewInMemoryTransports()
	down, err := downT.Connect(context.Background())
	require.NoError(t, err)
	upc, err := upT.Connect(context.Background())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	served = make(chan error, 1)
	go func() { served <- o.p.Serve(ctx, down, upc) }()
	return newRaw(t, hostT), newRaw(t, fakeT), cancel, served
}

// response is the host's next response, skipping notifications (list_changed relayed).
func response(t *testing.T, host *rawEnd, id any) string {
	t.Helper()
	for {
		if resp, ok := host.next(t).(*jsonrpc.Response); ok {
			require.EqualValues(t, id, resp.ID.Raw())
			require.Nil(t, resp.Error)
			return string(resp.Result)
		}
	}
}

// listOnce answers the upstream's next request, which must be tools/list, with tools.
func listOnce(t *testing.T, up *rawEnd, tools ...string) {
	t.Helper()
	list := up.nextReq(t)
	require.Equal(t, "tools/list", list.Method)
	up.answer(t, list.ID, `{"tools":[`+strings.Join(tools, ",")+`]}`)
}

// A tool the proxy has protected stays protected for the life of the proxy: an upstream that
// re-annotates it readOnlyHint: true (after list_changed, or in a later session) does not
// turn it into a relayed tool; the same call is a replay from the ledger, not dispatched.
func TestProxyKeepsAProtectedToolProtectedWhenReannotatedReadOnly(t *testing.T) {
	o := newOneProxy(t)
	host, up, _, _ := o.session(t)
	const call = `{"name":"write","arguments":{"path":"/a","text":"x"}}`
	host.send(t, float64(1), "tools/call", call)
	listOnce(t, up, writeDef)
	guarded := up.nextReq(t)
	require.Equal(t, "tools/call", guarded.Method)
	require.Regexp(t, proxyID, guarded.ID.Raw(), "protected: sent under the proxy's own id")
	up.answer(t, guarded.ID, `{"content":[{"type":"text","text":"written"}]}`)
	require.Contains(t, response(t, host, 1), "written")

	require.NoError(t, up.conn.Write(context.Background(), &jsonrpc.Request{Method: "notifications/tools/list_changed"}))
	// The proxy resets its catalogue before it relays the notification: once the host has it,
	// the next call fetches the list again (else the call could overtake the notification).
	changed, ok := host.next(t).(*jsonrpc.Request)
	require.True(t, ok)
	require.Equal(t, "notifications/tools/list_changed", changed.Method)
	host.send(t, float64(2), "tools/call", call)
	listOnce(t, up, writeReadOnlyDef)
	res := response(t, host, 2)
	require.Contains(t, res, mcpwire.MetaReplayed, "answered from the ledger: %s", res)
	host.send(t, float64(3), "ping", `{}`)
	next := up.nextReq(t)
	require.Equal(t, "ping", next.Method, "the call was not dispatched upstream: %s", next.Params)

	// A new session of the same proxy: the upstream lists it read-only from the start.
	host2, up2, _, _ := o.session(t)
	host2.send(t, float64(1), "tools/call", call)
	listOnce(t, up2, writeReadOnlyDef)
	res = response(t, host2, 1)
	require.Contains(t, res, mcpwire.MetaReplayed, "answered from the ledger: %s", res)
	host2.send(t, float64(2), "ping", `{}`)
	next = up2.nextReq(t)
	require.Equal(t, "ping", next.Method, "the call was not dispatched upstream: %s", next.Params)

	require.Equal(t, 1, strings.Count(o.logs.String(), "re-annotated"), o.logs.String())
}

// Over HTTP, what one namespace's proxy protected the others' protect too (one upstream),
// and the missing-target warning is given once for all of them.
func TestHTTPNamespacesShareWhatTheProxyProtected(t *testing.T) {
	o := newOneProxy(t)
	const tokA, tokB = "tok-a-0123456789abcdef", "tok-b-0123456789abcdef"
	r := newLimitRigOf(t, o.p, mcpproxy.HTTPOptions{}, map[string]string{tokA: "ns-a", tokB: "ns-b"})
	for _, c := range []struct{ tok, def string }{{tokA, writeDef}, {tokB, writeReadOnlyDef}} {
		session, up := r.initialize(t, c.tok)
		pending := r.postAsync(t, c.tok, session, "application/json",
			`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"write","arguments":{"path":"/a"}}}`)
		listOnce(t, up, c.def)
		guarded := up.nextReq(t)
		require.Equal(t, "tools/call", guarded.Method)
		require.Regexp(t, proxyID, guarded.ID.Raw(), "protected in %s: sent under the proxy's own id", c.tok)
		up.answer(t, guarded.ID, `{"content":[]}`)
		a := <-pending
		<-r.ended
		require.Contains(t, a.body, `"id":2`)
	}
	require.Equal(t, 1, strings.Count(o.logs.String(), "no target pointers"), o.logs.String())
}
