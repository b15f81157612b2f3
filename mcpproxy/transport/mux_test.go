package transport

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"
)

// TestMuxSameIDs: two connections sending a request with the same id at once each get
// their own answer with their own id (of the same JSON type), whatever the id looks like
// (a number, a string, a string that looks like an id the mux makes) and whichever answer
// comes first; upstream sees two different rewritten ids and the params unchanged.
func TestMuxSameIDs(t *testing.T) {
	for _, id := range []any{float64(1), "1", "tfmux:1:1", "tfmux:2:1", "tfmux:1:1:token", ""} {
		t.Run(fmt.Sprintf("%T %v", id, id), func(t *testing.T) {
			h := newMux(t, true)
			a, b := h.open(t), h.open(t)
			u := h.up(t)
			want, err := jsonrpc.MakeID(id)
			require.NoError(t, err)
			require.NoError(t, a.Write(context.Background(), call(id, "tools/call", `{"name":"a","arguments":{"x":1}}`)))
			require.NoError(t, b.Write(context.Background(), call(id, "tools/call", `{"name":"b"}`)))
			ra, rb := u.nextReq(t), u.nextReq(t)
			require.JSONEq(t, `{"name":"a","arguments":{"x":1}}`, string(ra.Params))
			require.JSONEq(t, `{"name":"b"}`, string(rb.Params))
			for _, r := range []*jsonrpc.Request{ra, rb} {
				s, ok := r.ID.Raw().(string)
				require.True(t, ok && strings.HasPrefix(s, muxPrefix), "upstream got id %#v", r.ID.Raw())
			}
			require.NotEqual(t, ra.ID, rb.ID)
			u.send(t, result(rb.ID, `{"who":"b"}`), result(ra.ID, `{"who":"a"}`))
			got := readResp(t, a)
			require.Equal(t, want, got.ID)
			require.JSONEq(t, `{"who":"a"}`, string(got.Result))
			got = readResp(t, b)
			require.Equal(t, want, got.ID)
			require.JSONEq(t, `{"who":"b"}`, string(got.Result))
			h.fence(t, u, a, b)
			require.Zero(t, routes(a)+routes(b), "answered requests are forgotten")
		})
	}
}

// TestMuxAnswersAnyOrder: a connection's answers come back in the order upstream sends
// them, each with its own id and result, errors included.
func TestMuxAnswersAnyOrder(t *testing.T) {
	h := newMux(t, true)
	c := h.open(t)
	u := h.up(t)
	var sent []*jsonrpc.Request
	for i := range 5 {
		require.NoError(t, c.Write(context.Background(), call(float64(i), "tools/call", fmt.Sprintf(`{"i":%d}`, i))))
		sent = append(sent, u.nextReq(t))
	}
	order := []int{3, 0, 4, 2, 1}
	for _, i := range order {
		if i == 2 {
			u.send(t, &jsonrpc.Response{ID: sent[i].ID, Error: &jsonrpc.Error{Code: -32000, Message: "boom"}})
			continue
		}
		u.send(t, result(sent[i].ID, fmt.Sprintf(`{"i":%d}`, i)))
	}
	for _, i := range order {
		r := readResp(t, c)
		require.Equal(t, int64(i), r.ID.Raw())
		if i == 2 {
			var we *jsonrpc.Error
			require.ErrorAs(t, r.Error, &we)
			require.Equal(t, "boom", we.Message)
			continue
		}
		require.JSONEq(t, fmt.Sprintf(`{"i":%d}`, i), string(r.Result))
	}
	require.Zero(t, routes(c))
}

// TestMuxStrayAnswers: an answer for an id nobody is waiting for (never sent, of a
// connection that does not exist, not a string, already answered) reaches no connection
// and is not a notice; an answered id is never answered twice.
func TestMuxStrayAnswers(t *testing.T) {
	h := newMux(t, true)
	a, b := h.open(t), h.open(t)
	u := h.up(t)
	require.NoError(t, a.Write(context.Background(), call(float64(1), "tools/call", `{}`)))
	r := u.nextReq(t)
	u.send(t, result(r.ID, `{"first":true}`))
	require.JSONEq(t, `{"first":true}`, string(readResp(t, a).Result))
	for _, id := range []any{r.ID.Raw(), "tfmux:1:99", "tfmux:2:1", "tfmux:9:1", "tfmux:x:1", "tfmux:", "1", float64(1)} {
		jid, err := jsonrpc.MakeID(id)
		require.NoError(t, err)
		u.send(t, result(jid, `{"stray":true}`))
	}
	h.fence(t, u, a, b)
}

// TestMuxReusedID: a connection that sends a second request under the id of one still in
// flight (a client's bug) gets each answered once, and its cancellation of that id, after
// the first is answered, names the second.
func TestMuxReusedID(t *testing.T) {
	h := newMux(t, true)
	a := h.open(t)
	u := h.up(t)
	require.NoError(t, a.Write(context.Background(), call(float64(1), "tools/call", `{"n":1}`)))
	r1 := u.nextReq(t)
	require.NoError(t, a.Write(context.Background(), call(float64(1), "tools/call", `{"n":2}`)))
	r2 := u.nextReq(t)
	require.NotEqual(t, r1.ID, r2.ID)
	u.send(t, result(r1.ID, `{"n":1}`), result(r1.ID, `{"n":1}`))
	require.JSONEq(t, `{"n":1}`, string(readResp(t, a).Result))
	require.NoError(t, a.Write(context.Background(), notification("notifications/cancelled", `{"requestId":1}`)))
	require.JSONEq(t, fmt.Sprintf(`{"requestId":%q}`, r2.ID.Raw()), string(u.nextReq(t).Params))
	u.send(t, result(r2.ID, `{"n":2}`))
	require.JSONEq(t, `{"n":2}`, string(readResp(t, a).Result))
	h.fence(t, u, a)
	require.Zero(t, routes(a))
}

// TestMuxProgress: a request's params._meta.progressToken (a number, a string, one that
// looks like the mux's) is rewritten upstream, other params and _meta kept; the progress
// notifications upstream sends with it go to that connection alone, with its own token
// back (a number stays a number); once the request is answered its token routes nothing.
func TestMuxProgress(t *testing.T) {
	h := newMux(t, true)
	a, b := h.open(t), h.open(t)
	u := h.up(t)
	tokens := []string{`7`, `"tok"`, `"tfmux:1:1:token"`}
	conns := []*muxConn{a, b, a}
	var reqs []*jsonrpc.Request
	for i, tok := range tokens {
		params := fmt.Sprintf(`{"name":"t","arguments":{"k":"v"},"_meta":{"progressToken":%s,"other":"kept"}}`, tok)
		require.NoError(t, conns[i].Write(context.Background(), call(float64(1+i), "tools/call", params)))
		r := u.nextReq(t)
		w := rewritten(t, r.Params, "_meta.progressToken")
		require.JSONEq(t, fmt.Sprintf(`{"name":"t","arguments":{"k":"v"},"_meta":{"progressToken":%q,"other":"kept"}}`, w), string(r.Params))
		reqs = append(reqs, r)
	}
	for i := len(reqs) - 1; i >= 0; i-- {
		w := rewritten(t, reqs[i].Params, "_meta.progressToken")
		u.send(t, notification("notifications/progress", fmt.Sprintf(`{"progressToken":%q,"progress":%d,"total":10}`, w, i)))
	}
	for _, i := range []int{2, 0} {
		n := readNote(t, a)
		require.Equal(t, "notifications/progress", n.Method)
		require.Equal(t, tokens[i], string(field(t, n.Params, "progressToken")))
		require.JSONEq(t, fmt.Sprintf(`{"progressToken":%s,"progress":%d,"total":10}`, tokens[i], i), string(n.Params))
	}
	n := readNote(t, b)
	require.Equal(t, tokens[1], string(field(t, n.Params, "progressToken")))

	// Answered: the token is no connection's any more.
	u.send(t, result(reqs[0].ID, `{}`))
	require.Equal(t, int64(1), readResp(t, a).ID.Raw())
	w := rewritten(t, reqs[0].Params, "_meta.progressToken")
	late := notification("notifications/progress", fmt.Sprintf(`{"progressToken":%q,"progress":9}`, w))
	u.send(t, late)
	require.Equal(t, "notifications/progress", h.notice(t).Method)
	// Tokens that are no connection's: not strings, unknown, of no open connection.
	for _, tok := range []string{`7`, `"tok"`, `"tfmux:1:77:token"`, `"tfmux:5:1:token"`, `null`} {
		u.send(t, notification("notifications/progress", fmt.Sprintf(`{"progressToken":%s,"progress":1}`, tok)))
		require.Equal(t, tok, string(field(t, h.notice(t).Params, "progressToken")))
	}
	h.fence(t, u, a, b)
}

// TestMuxTokensAreNotIDs: a request's rewritten id and its rewritten progress token are
// different routes: a progress notification naming the request's id, or a cancellation
// or a listen notification naming its token, is no connection's.
func TestMuxTokensAreNotIDs(t *testing.T) {
	h := newMux(t, true)
	a := h.open(t)
	u := h.up(t)
	require.NoError(t, a.Write(context.Background(), call(float64(1), "subscriptions/listen", `{"_meta":{"progressToken":"p"}}`)))
	r := u.nextReq(t)
	id, token := r.ID.Raw().(string), rewritten(t, r.Params, "_meta.progressToken")
	u.send(t, notification("notifications/progress", fmt.Sprintf(`{"progressToken":%q}`, id)),
		notification("notifications/cancelled", fmt.Sprintf(`{"requestId":%q}`, token)),
		notification("notifications/resources/updated", fmt.Sprintf(`{"_meta":{%q:%q}}`, MetaSubscriptionID, token)))
	for _, method := range []string{"notifications/progress", "notifications/cancelled", "notifications/resources/updated"} {
		require.Equal(t, method, h.notice(t).Method)
	}
	h.fence(t, u, a)
	require.Equal(t, 1, inFlight(a))
}

// TestMuxCancelled: a connection's notifications/cancelled naming one of its requests in
// flight reaches upstream naming the rewritten id (the rest kept); one naming an id not in
// flight (never sent, answered, another type) passes unchanged; upstream's cancellation of
// a connection's request reaches that connection with its own id.
func TestMuxCancelled(t *testing.T) {
	h := newMux(t, true)
	a, b := h.open(t), h.open(t)
	u := h.up(t)
	require.NoError(t, a.Write(context.Background(), call(float64(5), "tools/call", `{}`)))
	ra := u.nextReq(t)
	require.NoError(t, b.Write(context.Background(), call(float64(5), "tools/call", `{}`)))
	rb := u.nextReq(t)

	require.NoError(t, a.Write(context.Background(), notification("notifications/cancelled", `{"requestId":5,"reason":"user"}`)))
	n := u.nextReq(t)
	require.Equal(t, "notifications/cancelled", n.Method)
	require.False(t, n.IsCall())
	require.JSONEq(t, fmt.Sprintf(`{"requestId":%q,"reason":"user"}`, ra.ID.Raw()), string(n.Params))

	for _, params := range []string{`{"requestId":6}`, `{"requestId":"5"}`, `{"reason":"none"}`, `[1]`} {
		require.NoError(t, a.Write(context.Background(), notification("notifications/cancelled", params)))
		require.JSONEq(t, params, string(u.nextReq(t).Params), "not in flight: unchanged")
	}

	// Upstream cancels b's request: b hears of it with its own id.
	u.send(t, notification("notifications/cancelled", fmt.Sprintf(`{"requestId":%q,"reason":"server"}`, rb.ID.Raw())))
	n = readNote(t, b)
	require.JSONEq(t, `{"requestId":5,"reason":"server"}`, string(n.Params))

	u.send(t, result(ra.ID, `{}`))
	require.Equal(t, int64(5), readResp(t, a).ID.Raw())
	require.NoError(t, a.Write(context.Background(), notification("notifications/cancelled", `{"requestId":5}`)))
	require.JSONEq(t, `{"requestId":5}`, string(u.nextReq(t).Params), "answered: unchanged")
	h.fence(t, u, a, b)
}

// TestMuxCancelOthers: a connection cannot cancel another's request by naming its
// rewritten id: a cancellation naming an id in the mux's space that is not one of its own
// requests in flight reaches nobody.
func TestMuxCancelOthers(t *testing.T) {
	h := newMux(t, true)
	a, b := h.open(t), h.open(t)
	u := h.up(t)
	require.NoError(t, a.Write(context.Background(), call(float64(1), "tools/call", `{"_meta":{"progressToken":1}}`)))
	ra := u.nextReq(t)
	for _, named := range []any{ra.ID.Raw(), rewritten(t, ra.Params, "_meta.progressToken"), "tfmux:1:2", "tfmux:"} {
		params, err := json.Marshal(map[string]any{"requestId": named})
		require.NoError(t, err)
		require.NoError(t, b.Write(context.Background(), notification("notifications/cancelled", string(params))))
	}
	h.fence(t, u, a, b)
}

// TestMuxListen: a notification whose _meta subscriptionId is the rewritten id of a
// connection's open listen request goes to that connection alone with its own id back in
// its place (a number stays a number, the rest of _meta kept); once the listen request is
// answered, the stream's notifications are nobody's (OnNotice).
func TestMuxListen(t *testing.T) {
	h := newMux(t, true)
	a, b := h.open(t), h.open(t)
	u := h.up(t)
	require.NoError(t, a.Write(context.Background(), call("L", "subscriptions/listen", `{}`)))
	la := u.nextReq(t)
	require.NoError(t, b.Write(context.Background(), call(float64(3), "subscriptions/listen", `{}`)))
	lb := u.nextReq(t)
	upd := func(id jsonrpc.ID, uri string) *jsonrpc.Request {
		return notification("notifications/resources/updated", fmt.Sprintf(`{"uri":%q,"_meta":{%q:%q,"k":1}}`, uri, MetaSubscriptionID, id.Raw()))
	}
	u.send(t, upd(lb.ID, "b1"), upd(la.ID, "a1"), upd(la.ID, "a2"), upd(lb.ID, "b2"))
	for _, uri := range []string{"a1", "a2"} {
		n := readNote(t, a)
		require.Equal(t, "notifications/resources/updated", n.Method)
		require.JSONEq(t, fmt.Sprintf(`{"uri":%q,"_meta":{%q:"L","k":1}}`, uri, MetaSubscriptionID), string(n.Params))
	}
	for _, uri := range []string{"b1", "b2"} {
		n := readNote(t, b)
		require.JSONEq(t, fmt.Sprintf(`{"uri":%q,"_meta":{%q:3,"k":1}}`, uri, MetaSubscriptionID), string(n.Params))
	}
	u.send(t, result(la.ID, `{}`))
	require.Equal(t, "L", readResp(t, a).ID.Raw())
	u.send(t, upd(la.ID, "a3"))
	require.Equal(t, "notifications/resources/updated", h.notice(t).Method)
	h.fence(t, u, a, b)
	require.Equal(t, 1, inFlight(b), "b's listen request is still open")
}

// TestMuxUpstreamRequests: upstream's ping is answered with an empty result, any other
// request refused with method not found; neither reaches a connection or OnNotice. A
// connection's answers go nowhere.
func TestMuxUpstreamRequests(t *testing.T) {
	h := newMux(t, true)
	a, b := h.open(t), h.open(t)
	u := h.up(t)
	u.send(t, call(float64(1), "ping", ""))
	r := u.nextResp(t)
	require.Equal(t, int64(1), r.ID.Raw())
	require.NoError(t, r.Error)
	require.JSONEq(t, `{}`, string(r.Result))
	for _, m := range []string{"sampling/createMessage", "roots/list", "elicitation/create"} {
		u.send(t, call("s-"+m, m, `{}`))
		r = u.nextResp(t)
		require.Equal(t, "s-"+m, r.ID.Raw())
		var we *jsonrpc.Error
		require.ErrorAs(t, r.Error, &we)
		require.Equal(t, int64(jsonrpc.CodeMethodNotFound), we.Code)
	}
	require.NoError(t, a.Write(context.Background(), result(jsonrpc.ID{}, `{}`)))
	h.fence(t, u, a, b)
}

// TestMuxNotices: a notification that is no connection's goes to OnNotice as upstream sent
// it; without OnNotice it is dropped.
func TestMuxNotices(t *testing.T) {
	t.Run("OnNotice", func(t *testing.T) {
		h := newMux(t, true)
		a := h.open(t)
		u := h.up(t)
		u.send(t, notification("notifications/tools/list_changed", `{}`),
			notification("notifications/message", `{"level":"info","data":"x"}`),
			notification("notifications/resources/updated", fmt.Sprintf(`{"uri":"u","_meta":{%q:"nobody's"}}`, MetaSubscriptionID)),
			notification("notifications/cancelled", `{"requestId":"tfmux:1:9"}`))
		require.Equal(t, "notifications/tools/list_changed", h.notice(t).Method)
		require.JSONEq(t, `{"level":"info","data":"x"}`, string(h.notice(t).Params))
		require.Equal(t, "notifications/resources/updated", h.notice(t).Method)
		require.JSONEq(t, `{"requestId":"tfmux:1:9"}`, string(h.notice(t).Params))
		h.fence(t, u, a)
	})
	t.Run("nil", func(t *testing.T) {
		h := newMux(t, false)
		a := h.open(t)
		u := h.up(t)
		u.send(t, notification("notifications/tools/list_changed", `{}`))
		h.fence(t, u, a)
	})
}
