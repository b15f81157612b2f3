package mcpproxy_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpproxy"
)

// A tools/call of a tool the upstream does not list is answered with JSON-RPC error -32602
// naming the tool: nothing is reserved and upstream never sees the call. After
// list_changed the proxy lists again, and a tool listed now goes through the barrier.
func TestProxyRefusesAnUnlistedToolUnreserved(t *testing.T) {
	r := newRig(t, mcpproxy.Options{}, nil)
	r.host.send(t, float64(1), "tools/call", `{"name":"refund","arguments":{"order":"A"}}`)
	r.listed(t, chargeDef, readDef)
	resp := r.host.next(t).(*jsonrpc.Response)
	require.EqualValues(t, 1, resp.ID.Raw())
	var we *jsonrpc.Error
	require.ErrorAs(t, resp.Error, &we)
	require.EqualValues(t, jsonrpc.CodeInvalidParams, we.Code)
	require.Contains(t, we.Message, "Unknown tool: refund")
	r.nothingSentUpstream(t, 2)
	require.Empty(t, r.residuals(t))

	// The upstream now lists refund: the cached list is dropped and fetched again.
	require.NoError(t, r.up.conn.Write(context.Background(), &jsonrpc.Request{Method: "notifications/tools/list_changed", Params: json.RawMessage(`{}`)}))
	r.host.next(t) // the notification, relayed
	r.host.send(t, float64(3), "tools/call", `{"name":"refund","arguments":{"order":"A"}}`)
	r.listed(t, chargeDef, `{"name":"refund","inputSchema":{"type":"object"}}`)
	guarded := r.up.nextReq(t)
	require.Equal(t, "tools/call", guarded.Method)
	r.up.answer(t, guarded.ID, `{"content":[{"type":"text","text":"refunded"}]}`)
	require.Contains(t, r.hostResult(t, 3), "refunded")
	require.Len(t, r.residuals(t), 1)
}
