package mcpproxy_test

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/residual"
)

// A stateless (2026-07-28) host in front of an upstream that speaks 2025-11-25 only: the
// proxy bridges (legacyUp), and the upstream's elicitation during a call becomes a round
// of that call. Unlike a 2026-07-28 server's round, the upstream is still running the call.

// bridgedRound has the host call deploy (id 1) through the bridge and upstream ask for
// input during it; it returns upstream's tools/call and the round's requestState.
func (r *rig) bridgedRound(t *testing.T) (*jsonrpc.Request, string) {
	t.Helper()
	r.callDeploy(t, 1, "")
	d := r.up.nextReq(t)
	require.Equal(t, "server/discover", d.Method)
	require.NoError(t, r.up.conn.Write(t.Context(), &jsonrpc.Response{ID: d.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "method not found"}}))
	init := r.up.nextReq(t)
	require.Equal(t, "initialize", init.Method)
	r.up.answer(t, init.ID, `{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"old","version":"1"}}`)
	r.listed(t, confirmDef)
	call := r.up.nextReq(t)
	require.Equal(t, "tools/call", call.Method)
	r.up.send(t, "e1", "elicitation/create", `{"message":"Deploy?","requestedSchema":{"type":"object","properties":{}}}`)
	var round struct {
		ResultType   string `json:"resultType"`
		RequestState string `json:"requestState"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.hostResult(t, 1)), &round))
	require.Equal(t, "input_required", round.ResultType)
	require.NotEmpty(t, round.RequestState)
	return call, round.RequestState
}

// Upstream gives up waiting for the host's input and answers the call before the host
// continues: the continuation gets that answer, which is recorded as upstream gave it, and
// nothing is sent upstream again (before, the continuation was refused with invalid params
// and the call recorded failed, though it had run).
func TestBridgedRoundFinishedBeforeTheHostContinues(t *testing.T) {
	r, _ := roundRig(t)
	call, state := r.bridgedRound(t)
	r.up.answer(t, call.ID, `{"content":[{"type":"text","text":"deployed without asking"}]}`)
	r.nothingSentUpstream(t, 5) // upstream's answers come in order: the call's was read first
	r.callDeploy(t, 2, `,"inputResponses":{"upstream":{"action":"accept","content":{}}},"requestState":"`+state+`"`)
	require.Contains(t, r.hostResult(t, 2), "deployed without asking")
	rs := r.residuals(t)
	require.Len(t, rs, 1)
	require.Equal(t, residual.Succeeded, rs[0].State)
	require.Len(t, rs[0].Attempts, 1)
	r.nothingSentUpstream(t, 3)
}

// While upstream runs the call waiting for the host's input, the same call without the
// round's requestState (a retry, another agent) is refused: sent, it would run a second time.
func TestBridgedRoundRefusesTheSameCallWithoutItsState(t *testing.T) {
	r, _ := roundRig(t)
	call, state := r.bridgedRound(t)
	r.callDeploy(t, 2, "")
	require.Contains(t, r.hostResult(t, 2), "in progress upstream")
	r.nothingSentUpstream(t, 3)

	r.callDeploy(t, 4, `,"inputResponses":{"upstream":{"action":"accept","content":{}}},"requestState":"`+state+`"`)
	answer, ok := r.up.next(t).(*jsonrpc.Response)
	require.True(t, ok, "the host's input goes upstream as the elicitation's answer")
	require.EqualValues(t, "e1", answer.ID.Raw())
	r.up.answer(t, call.ID, `{"content":[{"type":"text","text":"deployed"}]}`)
	require.Contains(t, r.hostResult(t, 4), "deployed")
	require.Equal(t, residual.Succeeded, r.residuals(t)[0].State)
}

// A bridged round the host never continues is recorded unknown, not failed: the upstream
// was still running the call and may act without the input.
func TestBridgedRoundAbandonedIsUnknown(t *testing.T) {
	clock := lease.NewFake(time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC))
	pol, err := policy.Parse([]byte(`{"tools":{"deploy":{"mode":"protect","lease":"1h"}}}`))
	require.NoError(t, err)
	logs := &lockedBuffer{}
	r := newRig(t, mcpproxy.Options{Policy: pol, Logger: slog.New(slog.NewTextHandler(logs, nil))}, clock)
	r.bridgedRound(t)
	clock.BlockUntil(2)
	clock.Advance(mcpproxy.DefaultRoundTimeout + time.Second)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "multi-round call abandoned") }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, residual.Unknown, r.residuals(t)[0].State)
	require.Contains(t, r.residuals(t)[0].Attempts[0].Error, "still running the call")
	require.Contains(t, logs.String(), "outcome=unknown")
	require.NotContains(t, logs.String(), "could not record", "it was recorded")
}

// A 2025-11-25 host in front of an upstream that speaks 2026-07-28 only (statelessUp): the
// proxy gives up on a protected call whose round the host's user has not answered in time
// (recorded unknown, cancelled upstream). The user's late answer then sends nothing
// upstream: before, it sent the call again, outside any attempt of the guard.
func TestBridgedSessionLateAnswerAfterTimeoutSendsNothing(t *testing.T) {
	clock := lease.NewFake(time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC))
	pol, err := policy.Parse([]byte(`{"tools":{"deploy":{"mode":"protect","lease":"1h"}}}`))
	require.NoError(t, err)
	r := newRig(t, mcpproxy.Options{Policy: pol, Timeout: 300 * time.Millisecond}, clock)
	r.host.send(t, float64(0), "initialize", `{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},"clientInfo":{"name":"h","version":"1"}}`)
	init := r.up.nextReq(t)
	require.Equal(t, "initialize", init.Method)
	require.NoError(t, r.up.conn.Write(t.Context(), &jsonrpc.Response{ID: init.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "stateless only"}}))
	for range 2 { // the proxy's probe, then the bridge's own
		d := r.up.nextReq(t)
		require.Equal(t, "server/discover", d.Method)
		r.up.answer(t, d.ID, `{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{"tools":{}},"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"new","version":"1"}}}`)
	}
	require.Contains(t, r.hostResult(t, 0), `"protocolVersion":"2025-11-25"`)

	r.host.send(t, float64(1), "tools/call", `{"name":"deploy","arguments":{"env":"prod"}}`)
	r.listed(t, confirmDef)
	call := r.up.nextReq(t)
	require.Equal(t, "tools/call", call.Method)
	r.up.answer(t, call.ID, askResult("s1"))
	ask, ok := r.host.next(t).(*jsonrpc.Request)
	require.True(t, ok)
	require.Equal(t, "elicitation/create", ask.Method, "the round becomes the host's own request")

	resp, ok := r.host.next(t).(*jsonrpc.Response) // the proxy's timeout: unknown
	require.True(t, ok)
	require.EqualValues(t, 1, resp.ID.Raw())
	require.Eventually(t, func() bool { return r.residuals(t)[0].State == residual.Unknown }, 5*time.Second, 10*time.Millisecond)

	r.host.answer(t, ask.ID, `{"action":"accept","content":{}}`) // the user answers, late
	r.host.send(t, float64(2), "resources/list", `{}`)           // the bridge answers ping itself
	next := r.up.nextReq(t)
	require.Equal(t, "resources/list", next.Method, "nothing else was sent upstream before it: %s", next.Params)
}

// A call echoing the requestState of a bridged round the proxy no longer holds (abandoned)
// is refused and nothing is begun or sent: it must not take the answer the bridge kept for
// that round's call, which was another call.
func TestBridgedRoundStaleStateIsRefused(t *testing.T) {
	r, clock := roundRig(t)
	call, state := r.bridgedRound(t)
	r.up.answer(t, call.ID, `{"content":[{"type":"text","text":"deployed prod"}]}`)
	clock.BlockUntil(2)
	clock.Advance(mcpproxy.DefaultRoundTimeout + time.Second)
	require.Eventually(t, func() bool { return r.residuals(t)[0].State == residual.Unknown }, 5*time.Second, 10*time.Millisecond)

	r.host.send(t, float64(2), "tools/call", `{"name":"deploy","arguments":{"env":"staging"},`+meta2026+`,"inputResponses":{"upstream":{"action":"accept"}},"requestState":"`+state+`"`+`}`)
	got := r.hostResult(t, 2)
	require.Contains(t, got, "no longer in progress")
	require.NotContains(t, got, "deployed prod")
	require.Len(t, r.residuals(t), 1, "nothing begun for the staging call")
	r.nothingSentUpstream(t, 3)
}
