package mcpproxy_test

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/residual"
)

// Two calls meet the same unknown residual and both probe. The first probe says "not found":
// its call resolves the residual failed and dispatches attempt 2, whose outcome is unknown
// (isError after the effect). The second probe's "not found" arrives late; it is about
// attempt 1, so it must not resolve attempt 2 as failed: its call answers unknown_outcome
// and nothing is dispatched a third time.
func TestProxyStaleProbeAnswerNeverResolvesALaterAttempt(t *testing.T) {
	pol, err := policy.Parse([]byte(`{"tools":{"charge":{"mode":"protect","target":["/order"],"timeout":"5s",
		"probe":{"tool":"find","arguments":{"order":"/order"},"found":"/found","not_found_after":"1ns"}}}}`))
	require.NoError(t, err)
	r := newRig(t, mcpproxy.Options{Policy: pol}, nil)
	host, up, l, ic := r.host, r.up, r.l, r.ic

	const chargeDef = `{"name":"charge","inputSchema":{"type":"object"}}`
	const findDef = `{"name":"find","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}`
	host.send(t, float64(1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	list := up.nextReq(t)
	require.Equal(t, "tools/list", list.Method)
	up.answer(t, list.ID, `{"tools":[`+chargeDef+`,`+findDef+`]}`)
	first := up.nextReq(t)
	up.answer(t, first.ID, `{"isError":true,"content":[{"type":"text","text":"boom"}]}`) // attempt 1: unknown
	require.Contains(t, string(host.next(t).(*jsonrpc.Response).Result), "unknown")

	host.send(t, float64(2), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	host.send(t, float64(3), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	pa, pb := up.nextReq(t), up.nextReq(t)
	require.Contains(t, string(pa.Params), `"find"`)
	require.Contains(t, string(pb.Params), `"find"`)
	up.answer(t, pa.ID, `{"content":[],"structuredContent":{"found":false}}`)
	second := up.nextReq(t)
	require.Contains(t, string(second.Params), `"charge"`)
	up.answer(t, second.ID, `{"isError":true,"content":[{"type":"text","text":"boom after the charge"}]}`) // attempt 2: unknown
	require.Contains(t, string(host.next(t).(*jsonrpc.Response).Result), "unknown")

	// The late answer of the other probe, about attempt 1.
	up.answer(t, pb.ID, `{"content":[],"structuredContent":{"found":false}}`)
	resp := host.next(t).(*jsonrpc.Response)
	require.Contains(t, string(resp.Result), "unknown_outcome", "the call is blocked by attempt 2's unknown outcome")
	page, err := l.List(context.Background(), ledger.ListParams{Namespace: ic.Namespace()})
	require.NoError(t, err)
	require.Len(t, page.Residuals, 1)
	got := page.Residuals[0]
	require.Equal(t, residual.Unknown, got.State, "attempt 2 stays unknown")
	require.Len(t, got.Attempts, 2, "no third attempt")
	require.Len(t, got.Resolutions, 1, "only the first probe's answer (about attempt 1) was recorded")
}
