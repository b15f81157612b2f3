package mcpproxy_test

import (
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/residual"
)

// meta2026 is the _meta of a 2026-07-28 host's request.
const meta2026 = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}`

const confirmDef = `{"name":"deploy","inputSchema":{"type":"object","properties":{"env":{"type":"string"}}}}`

// askResult is upstream's input_required answer asking to confirm, with requestState st.
func askResult(st string) string {
	return `{"resultType":"input_required","inputRequests":{"ok":{"method":"elicitation/create","params":{"message":"Deploy?","requestedSchema":{"type":"object","properties":{}}}}},"requestState":"` + st + `"}`
}

// roundRig is a rig whose tool deploy is protected with a lease of an hour, on a fake clock.
func roundRig(t *testing.T) (*rig, *lease.Fake) {
	clock := lease.NewFake(time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC))
	pol, err := policy.Parse([]byte(`{"tools":{"deploy":{"mode":"protect","lease":"1h"}}}`))
	require.NoError(t, err)
	return newRig(t, mcpproxy.Options{Policy: pol}, clock), clock
}

// openRound has the host call deploy (id 1) and upstream answer input_required (state s1).
func (r *rig) openRound(t *testing.T) {
	t.Helper()
	r.callDeploy(t, 1, "")
	r.discovered(t)
	r.listed(t, confirmDef)
	r.up.answer(t, r.up.nextReq(t).ID, askResult("s1"))
	r.hostResult(t, 1)
}

// discovered answers the proxy's server/discover, which comes before a stateless host's
// first request is relayed: upstream speaks 2026-07-28 too.
func (r *rig) discovered(t *testing.T) {
	t.Helper()
	d := r.up.nextReq(t)
	require.Equal(t, "server/discover", d.Method)
	r.up.answer(t, d.ID, `{"resultType":"complete","supportedVersions":["2026-07-28","2025-11-25"],"capabilities":{"tools":{}}}`)
}

func (r *rig) callDeploy(t *testing.T, id float64, extra string) {
	r.host.send(t, id, "tools/call", `{"name":"deploy","arguments":{"env":"prod"},`+meta2026+extra+`}`)
}

// A tools/call answered input_required is one logical call with its continuations: the
// attempt stays pending (nothing recorded) while the host answers, the continuation goes
// upstream under the same attempt (no Begin, no replay, no refusal), and only the final
// answer is recorded, once.
func TestProxyMultiRoundCallIsOneLogicalCall(t *testing.T) {
	r, _ := roundRig(t)
	r.callDeploy(t, 1, "")
	r.discovered(t)
	list := r.up.nextReq(t)
	require.Equal(t, "tools/list", list.Method)
	var lp struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(list.Params, &lp))
	require.JSONEq(t, `"2026-07-28"`, string(lp.Meta["io.modelcontextprotocol/protocolVersion"]), "the proxy's own request speaks the host's stateless revision")
	require.JSONEq(t, `{"elicitation":{}}`, string(lp.Meta["io.modelcontextprotocol/clientCapabilities"]), "with the host's capabilities")
	r.up.answer(t, list.ID, `{"tools":[`+confirmDef+`]}`)

	first := r.up.nextReq(t)
	require.Equal(t, "tools/call", first.Method)
	r.up.answer(t, first.ID, askResult("s1"))
	require.JSONEq(t, askResult("s1"), r.hostResult(t, 1), "the host gets upstream's round as it is")
	rs := r.residuals(t)
	require.Len(t, rs, 1)
	require.Equal(t, residual.Pending, rs[0].State, "an input_required answer records nothing")

	// Round two, then the final answer.
	for i, st := range []string{"s1", "s2"} {
		r.callDeploy(t, float64(2+i), `,"inputResponses":{"ok":{"action":"accept","content":{}}},"requestState":"`+st+`"`)
		cont := r.up.nextReq(t)
		require.Equal(t, "tools/call", cont.Method, "the continuation is dispatched, not replayed or refused")
		require.Contains(t, string(cont.Params), `"requestState":"`+st+`"`)
		if i == 0 {
			r.up.answer(t, cont.ID, askResult("s2"))
			require.JSONEq(t, askResult("s2"), r.hostResult(t, 2))
			continue
		}
		r.up.answer(t, cont.ID, `{"resultType":"complete","content":[{"type":"text","text":"deployed"}]}`)
		require.Contains(t, r.hostResult(t, 3), "deployed")
	}
	rs = r.residuals(t)
	require.Len(t, rs, 1)
	require.Equal(t, residual.Succeeded, rs[0].State)
	require.Len(t, rs[0].Attempts, 1, "three rounds, one attempt")
	require.Contains(t, string(rs[0].Result), "deployed")

	// Settled, and the host had the answer just now: the same call again cannot be told from
	// a repeat by the call alone, so the host's user is asked in a round of the proxy's own;
	// the user declines, and the call is answered from the ledger. Nothing is sent.
	r.callDeploy(t, 4, "")
	q := r.hostResult(t, 4)
	require.Contains(t, q, `"resultType":"input_required"`)
	require.Contains(t, q, "Run it again?")
	var round struct {
		RequestState string `json:"requestState"`
	}
	require.NoError(t, json.Unmarshal([]byte(q), &round))
	r.callDeploy(t, 5, `,"inputResponses":{"toolfence.dev/question":{"action":"accept","content":{"answer":"Don't run it"}}},"requestState":"`+round.RequestState+`"`)
	replay := r.hostResult(t, 5)
	require.Contains(t, replay, "[replayed] not sent")
	require.Contains(t, replay, "the host's user chose not to run it again")
	require.Contains(t, replay, "deployed")
	r.nothingSentUpstream(t, 6)
}

// A continuation with other arguments is refused and nothing is sent; the round stays open
// and takes the continuation with the call's own arguments.
func TestProxyRoundRefusesContinuationWithOtherArguments(t *testing.T) {
	r, _ := roundRig(t)
	r.openRound(t)

	r.host.send(t, float64(2), "tools/call", `{"name":"deploy","arguments":{"env":"staging"},`+meta2026+`,"inputResponses":{},"requestState":"s1"}`)
	require.Contains(t, r.hostResult(t, 2), "with other arguments; nothing was sent")
	r.nothingSentUpstream(t, 3)

	r.callDeploy(t, 4, `,"inputResponses":{"ok":{"action":"accept"}},"requestState":"s1"`)
	r.up.answer(t, r.up.nextReq(t).ID, `{"content":[{"type":"text","text":"deployed"}]}`)
	require.Contains(t, r.hostResult(t, 4), "deployed")
	rs := r.residuals(t)
	require.Equal(t, residual.Succeeded, rs[0].State)
}

// A round the host never continues is abandoned after RoundTimeout and recorded failed:
// upstream had not finished the call. A later call begins a new attempt.
func TestProxyAbandonedRoundIsRecordedFailed(t *testing.T) {
	r, clock := roundRig(t)
	r.openRound(t)
	require.Equal(t, residual.Pending, r.residuals(t)[0].State)

	clock.BlockUntil(2) // the lease's renewal and the round's deadline
	clock.Advance(mcpproxy.DefaultRoundTimeout - time.Second)
	require.Equal(t, residual.Pending, r.residuals(t)[0].State, "not yet abandoned")
	clock.Advance(2 * time.Second)
	require.Eventually(t, func() bool { return r.residuals(t)[0].State == residual.Failed }, 5*time.Second, 10*time.Millisecond)
	rs := r.residuals(t)
	require.Contains(t, rs[0].Attempts[0].Error, "abandoned multi-round call")

	r.callDeploy(t, 2, "")
	again := r.up.nextReq(t)
	require.Equal(t, "tools/call", again.Method, "a new attempt after the abandoned one")
	require.NotContains(t, string(again.Params), "requestState")
	r.up.answer(t, again.ID, `{"content":[{"type":"text","text":"deployed"}]}`)
	require.Contains(t, r.hostResult(t, 2), "deployed")
	require.Len(t, r.residuals(t)[0].Attempts, 2)
}

// When the host's session ends, its open rounds are abandoned (recorded failed) at once.
func TestProxyRoundAbandonedWhenSessionEnds(t *testing.T) {
	r, _ := roundRig(t)
	r.openRound(t)
	require.NoError(t, r.host.conn.Close())
	require.Eventually(t, func() bool { return r.residuals(t)[0].State == residual.Failed }, 5*time.Second, 10*time.Millisecond)
}

// A continuation that upstream refuses (a tampered requestState) ends the call as upstream's
// answer says: a JSON-RPC invalid-params error proves no effect (failed).
func TestProxyRoundWithTamperedStateEndsAsUpstreamSays(t *testing.T) {
	r, _ := roundRig(t)
	r.openRound(t)

	r.callDeploy(t, 2, `,"inputResponses":{"ok":{"action":"accept"}},"requestState":"forged"`)
	cont := r.up.nextReq(t)
	require.Contains(t, string(cont.Params), `"requestState":"forged"`, "the proxy does not judge upstream's state")
	require.NoError(t, r.up.conn.Write(t.Context(), &jsonrpc.Response{ID: cont.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "invalid requestState"}}))
	resp, ok := r.host.next(t).(*jsonrpc.Response)
	require.True(t, ok)
	require.ErrorContains(t, resp.Error, "invalid requestState", "the host gets upstream's error")
	require.Equal(t, residual.Failed, r.residuals(t)[0].State)
}

// A result whose resultType the proxy does not know is not a success.
func TestProxyUnknownResultTypeIsNotSuccess(t *testing.T) {
	r, _ := roundRig(t)
	r.callDeploy(t, 1, "")
	r.discovered(t)
	r.listed(t, confirmDef)
	r.up.answer(t, r.up.nextReq(t).ID, `{"resultType":"later","content":[{"type":"text","text":"deployed"}]}`)
	require.Contains(t, r.hostResult(t, 1), "unknown")
	require.Equal(t, residual.Unknown, r.residuals(t)[0].State)
}

// The host's cancellation of a protected call does not cut it off upstream (that would
// leave its outcome unknown): nothing is sent upstream for it, upstream's answer is
// recorded, the host (which no longer waits) gets no answer, and its retry is answered from
// the ledger.
func TestProxyHostCancellationLetsTheCallFinish(t *testing.T) {
	r := newRig(t, mcpproxy.Options{}, nil)
	r.host.send(t, float64(1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	r.listed(t, chargeDef)
	guarded := r.up.nextReq(t)
	require.NoError(t, r.host.conn.Write(t.Context(), &jsonrpc.Request{Method: "notifications/cancelled", Params: json.RawMessage(`{"requestId":1,"reason":"timeout"}`)}))
	r.host.send(t, float64(2), "ping", `{}`)
	ping := r.up.nextReq(t)
	require.Equal(t, "ping", ping.Method, "nothing but the ping went upstream: no cancellation of the charge")
	r.up.answer(t, guarded.ID, `{"content":[{"type":"text","text":"charged A"}]}`)
	r.up.answer(t, ping.ID, `{}`)
	pong, ok := r.host.next(t).(*jsonrpc.Response)
	require.True(t, ok)
	require.EqualValues(t, 2, pong.ID.Raw(), "the cancelled call's answer is not written to the host")
	require.Eventually(t, func() bool { return r.residuals(t)[0].State == residual.Succeeded }, 5*time.Second, 10*time.Millisecond,
		"the charge's outcome is recorded")

	r.host.send(t, float64(3), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	retry := r.hostResult(t, 3)
	require.Contains(t, retry, "[replayed] not sent")
	require.Contains(t, retry, "its earlier answer may not have reached the host")
	require.Contains(t, retry, "charged A")
	r.nothingSentUpstream(t, 4)
}

// countingClock counts the waits for no time at all that the proxy asks its clock for.
type countingClock struct {
	*lease.Fake
	zero atomic.Int64
}

func (c *countingClock) After(d time.Duration) <-chan time.Time {
	if d <= 0 {
		c.zero.Add(1)
	}
	return c.Fake.After(d)
}

// A continuation still in flight when the round's deadline passes keeps the round (it is
// not abandoned under the call), and the round's watcher waits for it instead of polling
// the clock in a loop until upstream answers.
func TestProxyRoundInFlightPastDeadlineWaits(t *testing.T) {
	clock := &countingClock{Fake: lease.NewFake(time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC))}
	pol, err := policy.Parse([]byte(`{"tools":{"deploy":{"mode":"protect","lease":"1h"}}}`))
	require.NoError(t, err)
	r := newRig(t, mcpproxy.Options{Policy: pol}, clock)
	r.openRound(t)
	clock.BlockUntil(2) // the lease's renewal and the round's deadline

	r.callDeploy(t, 2, `,"inputResponses":{"ok":{"action":"accept"}},"requestState":"s1"`)
	cont := r.up.nextReq(t)
	clock.Advance(mcpproxy.DefaultRoundTimeout + time.Second) // upstream is slow to answer
	r.host.send(t, float64(3), "ping", `{}`)
	r.up.answer(t, r.up.nextReq(t).ID, `{}`) // the proxy went on meanwhile
	_, ok := r.host.next(t).(*jsonrpc.Response)
	require.True(t, ok)
	require.Equal(t, residual.Pending, r.residuals(t)[0].State, "not abandoned while its continuation is in flight")

	r.up.answer(t, cont.ID, `{"resultType":"complete","content":[{"type":"text","text":"deployed"}]}`)
	require.Contains(t, r.hostResult(t, 2), "deployed")
	require.Equal(t, residual.Succeeded, r.residuals(t)[0].State)
	require.LessOrEqual(t, clock.zero.Load(), int64(2), "the watcher polled the clock in a loop")
}

// A stateless host's user who declines the proxy's question (no choice) is not asked it
// again: the call is answered from the ledger and nothing is sent.
func TestProxyDeclinedQuestionIsNotAskedAgain(t *testing.T) {
	r, _ := roundRig(t)
	r.callDeploy(t, 1, "")
	r.discovered(t)
	r.listed(t, confirmDef)
	r.up.answer(t, r.up.nextReq(t).ID, `{"resultType":"complete","content":[{"type":"text","text":"deployed"}]}`)
	require.Contains(t, r.hostResult(t, 1), "deployed")

	r.callDeploy(t, 2, "")
	q := r.hostResult(t, 2)
	require.Contains(t, q, "Run it again?")
	var round struct {
		RequestState string `json:"requestState"`
	}
	require.NoError(t, json.Unmarshal([]byte(q), &round))
	r.callDeploy(t, 3, `,"inputResponses":{"toolfence.dev/question":{"action":"decline"}},"requestState":"`+round.RequestState+`"`)
	replay := r.hostResult(t, 3)
	require.NotContains(t, replay, `"resultType":"input_required"`, "asked again")
	require.Contains(t, replay, "[replayed] not sent")
	require.Contains(t, replay, "deployed")
	r.nothingSentUpstream(t, 4)
}
