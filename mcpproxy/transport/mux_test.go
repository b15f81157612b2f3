package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The Mux tests are not parallel: each checks with goleak that it leaves no goroutine
// behind, and goleak sees every goroutine of the process (parallel tests only start once
// the sequential ones have finished).

// muxWait bounds every wait for something that must happen; it only matters when a test
// is failing. That something did not happen is shown by what came after it (fence), never
// by waiting.
const muxWait = 5 * time.Second

// fakeUpstream is the server end of one dial of a Mux: it reads exactly what the mux
// wrote, as line-framed JSON-RPC over pipes, and writes what a server would.
type fakeUpstream struct {
	conn   *lineConn
	got    chan jsonrpc.Message // what the mux wrote, in order
	done   chan struct{}        // closed when the reading of got ended
	closes atomic.Int32         // calls of the closer the dial returned
	closed chan struct{}        // closed by the first call of the closer
}

// close is the closer of the dial that made u.
func (u *fakeUpstream) close() error {
	if u.closes.Add(1) == 1 {
		close(u.closed)
	}
	return nil
}

// newFakeUpstream returns the mux's end of a new pair of pipes and the fake server on the
// other end.
func newFakeUpstream() (mcp.Connection, *fakeUpstream) {
	downR, upW := io.Pipe() // upstream → mux
	upR, downW := io.Pipe() // mux → upstream
	mine := newLineConn(downR, downW, func() error {
		_ = downR.Close()
		return downW.Close()
	})
	u := &fakeUpstream{got: make(chan jsonrpc.Message, 1<<14), done: make(chan struct{}), closed: make(chan struct{})}
	u.conn = newLineConn(upR, upW, func() error {
		_ = upR.Close()
		return upW.Close()
	})
	go func() {
		defer close(u.done)
		for {
			m, err := u.conn.Read(context.Background())
			if err != nil {
				return
			}
			u.got <- m
		}
	}()
	return mine, u
}

// next returns the next message the mux wrote upstream.
func (u *fakeUpstream) next(t *testing.T) jsonrpc.Message {
	t.Helper()
	select {
	case m := <-u.got:
		return m
	case <-time.After(muxWait):
		t.Fatal("upstream: no message from the mux")
		return nil
	}
}

// nextReq returns the next message the mux wrote upstream, which must be a request.
func (u *fakeUpstream) nextReq(t *testing.T) *jsonrpc.Request {
	t.Helper()
	return must[*jsonrpc.Request](t, u.next(t))
}

// nextResp returns the next message the mux wrote upstream, which must be a response.
func (u *fakeUpstream) nextResp(t *testing.T) *jsonrpc.Response {
	t.Helper()
	return must[*jsonrpc.Response](t, u.next(t))
}

// must returns m as a T (a request or a response).
func must[T jsonrpc.Message](t *testing.T, m jsonrpc.Message) T {
	t.Helper()
	v, ok := m.(T)
	require.True(t, ok, "want a %T, got %#v", v, m)
	return v
}

// send writes msgs to the mux, as the server.
func (u *fakeUpstream) send(t *testing.T, msgs ...jsonrpc.Message) {
	t.Helper()
	for _, m := range msgs {
		require.NoError(t, u.conn.Write(context.Background(), m))
	}
}

// hangUp ends the server: the mux reads EOF.
func (u *fakeUpstream) hangUp() { _ = u.conn.Close() }

// muxHarness is a Mux over fake upstreams (one per dial), recording what it gives OnNotice.
type muxHarness struct {
	m       *Mux
	notices chan *jsonrpc.Request
	// wrap, if set, wraps the mux's end of each dial.
	wrap func(mcp.Connection) mcp.Connection

	mu    sync.Mutex
	ups   []*fakeUpstream
	conns []*muxConn
}

// newMux returns a Mux whose Dial makes a fake upstream; with noticed, its OnNotice records
// into notices. At the end of the test it closes what is left and checks that no goroutine
// is left behind.
func newMux(t *testing.T, noticed bool) *muxHarness {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	h := &muxHarness{notices: make(chan *jsonrpc.Request, 1<<10)}
	h.m = &Mux{Dial: func(context.Context) (mcp.Connection, io.Closer, error) {
		conn, u := newFakeUpstream()
		h.mu.Lock()
		h.ups = append(h.ups, u)
		h.mu.Unlock()
		if h.wrap != nil {
			conn = h.wrap(conn)
		}
		return conn, closerFunc(u.close), nil
	}}
	if noticed {
		h.m.OnNotice = func(n *jsonrpc.Request) { h.notices <- n }
	}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.conns {
			_ = c.Close()
		}
		_ = h.m.Close()
		for _, u := range h.ups {
			u.hangUp()
			<-u.done
		}
	})
	return h
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// open opens a connection on the mux.
func (h *muxHarness) open(t *testing.T) *muxConn {
	t.Helper()
	conn, closer, err := h.m.Open(context.Background())
	require.NoError(t, err)
	c, ok := conn.(*muxConn)
	require.True(t, ok)
	require.Same(t, c, closer, "the closer is the connection's Close")
	h.mu.Lock()
	h.conns = append(h.conns, c)
	h.mu.Unlock()
	return c
}

// up returns the fake upstream of the last dial.
func (h *muxHarness) up(t *testing.T) *fakeUpstream {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	require.NotEmpty(t, h.ups, "nothing was dialed")
	return h.ups[len(h.ups)-1]
}

// dials is how many times the mux dialed.
func (h *muxHarness) dials() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ups)
}

// noNotice checks that OnNotice got nothing so far: call it after a fence.
func (h *muxHarness) noNotice(t *testing.T) {
	t.Helper()
	select {
	case n := <-h.notices:
		t.Fatalf("OnNotice got %s %s", n.Method, n.Params)
	default:
	}
}

// notice returns what OnNotice got next.
func (h *muxHarness) notice(t *testing.T) *jsonrpc.Request {
	t.Helper()
	select {
	case n := <-h.notices:
		return n
	case <-time.After(muxWait):
		t.Fatal("OnNotice got nothing")
		return nil
	}
}

// read returns the next message upstream sent c.
func read(t *testing.T, c mcp.Connection) jsonrpc.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), muxWait)
	defer cancel()
	m, err := c.Read(ctx)
	require.NoError(t, err)
	return m
}

// readResp returns the next message upstream sent c, which must be a response.
func readResp(t *testing.T, c mcp.Connection) *jsonrpc.Response {
	t.Helper()
	return must[*jsonrpc.Response](t, read(t, c))
}

// readNote returns the next message upstream sent c, which must be a notification.
func readNote(t *testing.T, c mcp.Connection) *jsonrpc.Request {
	t.Helper()
	r := must[*jsonrpc.Request](t, read(t, c))
	require.False(t, r.IsCall(), "want a notification, got %#v", r)
	return r
}

// fence proves that nothing is queued for any of conns (nor for OnNotice, when it records):
// each sends a request, upstream (whose next messages must be these) answers them, and each
// connection's next message must be its answer. The mux reads upstream in order, so
// anything wrongly delivered before would be read first.
func (h *muxHarness) fence(t *testing.T, u *fakeUpstream, conns ...*muxConn) {
	t.Helper()
	for i, c := range conns {
		require.NoError(t, c.Write(context.Background(), call("fence", "fence", fmt.Sprintf(`{"n":%d}`, i))))
		r := u.nextReq(t)
		require.Equal(t, "fence", r.Method, "upstream got something before the fence: %s %s", r.Method, r.Params)
		u.send(t, &jsonrpc.Response{ID: r.ID, Result: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
	}
	for i, c := range conns {
		r := readResp(t, c)
		require.Equal(t, "fence", r.ID.Raw(), "connection %d got something before its fence: %#v", i, r)
		require.JSONEq(t, fmt.Sprintf(`{"n":%d}`, i), string(r.Result))
	}
	h.noNotice(t)
}

// call is a request with id (a float64 for a number, or a string).
func call(id any, method, params string) *jsonrpc.Request {
	jid, err := jsonrpc.MakeID(id)
	if err != nil {
		panic(err)
	}
	r := &jsonrpc.Request{ID: jid, Method: method}
	if params != "" {
		r.Params = json.RawMessage(params)
	}
	return r
}

// notification is a notification.
func notification(method, params string) *jsonrpc.Request {
	return &jsonrpc.Request{Method: method, Params: json.RawMessage(params)}
}

// result is an answer to id.
func result(id jsonrpc.ID, res string) *jsonrpc.Response {
	return &jsonrpc.Response{ID: id, Result: json.RawMessage(res)}
}

// field returns params[key] (a dotted path, "_meta.progressToken"), as sent.
func field(t *testing.T, params json.RawMessage, path string) json.RawMessage {
	t.Helper()
	raw := params
	for _, k := range strings.Split(path, ".") {
		var doc map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(raw, &doc), "params %s", params)
		v, ok := doc[k]
		require.True(t, ok, "%s: no %q in %s", path, k, params)
		raw = v
	}
	return raw
}

// rewritten returns the string a field of params holds, which must be a mux id or token.
func rewritten(t *testing.T, params json.RawMessage, path string) string {
	t.Helper()
	var s string
	require.NoError(t, json.Unmarshal(field(t, params, path), &s))
	require.True(t, strings.HasPrefix(s, muxPrefix), "%s = %q is not rewritten", path, s)
	return s
}

// routes is how many ids and tokens c remembers.
func routes(c *muxConn) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.reqs) + len(c.byOrig)
}

// inFlight is how many of c's requests await their answer.
func inFlight(c *muxConn) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.reqs)
}

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

// TestMuxConnClose: a closed connection reads io.EOF and cannot write; an answer or a
// progress notification for it that arrives later reaches nobody else; the shared
// connection stays up for the others; Close twice is fine.
func TestMuxConnClose(t *testing.T) {
	h := newMux(t, true)
	a, b := h.open(t), h.open(t)
	u := h.up(t)
	require.Equal(t, 2, h.m.Conns())
	require.NoError(t, a.Write(context.Background(), call(float64(1), "tools/call", `{"_meta":{"progressToken":1}}`)))
	r := u.nextReq(t)
	require.NoError(t, a.Close())
	require.NoError(t, a.Close())
	require.Equal(t, 1, h.m.Conns())
	_, err := a.Read(context.Background())
	require.ErrorIs(t, err, io.EOF)
	require.Error(t, a.Write(context.Background(), call(float64(2), "tools/list", "")))
	require.Equal(t, "notifications/cancelled", u.nextReq(t).Method) // TestMuxCloseCancels
	u.send(t, notification("notifications/progress", fmt.Sprintf(`{"progressToken":%q}`, rewritten(t, r.Params, "_meta.progressToken"))))
	require.Equal(t, "notifications/progress", h.notice(t).Method)
	u.send(t, result(r.ID, `{}`))
	h.fence(t, u, b)
	require.Equal(t, 1, h.dials())
}

// TestMuxReadContext: a Read waiting for a message ends with its context's error.
func TestMuxReadContext(t *testing.T) {
	h := newMux(t, true)
	a := h.open(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := a.Read(ctx)
	require.ErrorIs(t, err, context.Canceled)
}

// TestMuxUpstreamEnds: when upstream ends, every connection reads what was already sent
// it, then io.EOF, and its writes fail with io.EOF; the ended connection's closer is
// called (a stdio child's process group ends), once; the next Open dials a new shared
// connection, which the old connections never see.
func TestMuxUpstreamEnds(t *testing.T) {
	h := newMux(t, true)
	a, b := h.open(t), h.open(t)
	u := h.up(t)
	require.NoError(t, a.Write(context.Background(), call(float64(1), "tools/call", `{}`)))
	r := u.nextReq(t)
	u.send(t, result(r.ID, `{"last":true}`))
	u.hangUp()
	require.JSONEq(t, `{"last":true}`, string(readResp(t, a).Result))
	for _, c := range []*muxConn{a, b} {
		_, err := c.Read(context.Background())
		require.ErrorIs(t, err, io.EOF)
		_, err = c.Read(context.Background())
		require.ErrorIs(t, err, io.EOF)
		require.ErrorIs(t, c.Write(context.Background(), call(float64(2), "tools/list", "")), io.EOF)
	}
	select {
	case <-u.closed:
	case <-time.After(muxWait):
		t.Fatal("the ended upstream connection's closer was not called")
	}
	c := h.open(t)
	require.Equal(t, 2, h.dials())
	u2 := h.up(t)
	require.NotSame(t, u, u2)
	require.Equal(t, 1, h.m.Conns(), "the new shared connection has one connection")
	require.NoError(t, c.Write(context.Background(), call(float64(1), "tools/call", `{}`)))
	r = u2.nextReq(t)
	u2.send(t, result(r.ID, `{"new":true}`))
	require.JSONEq(t, `{"new":true}`, string(readResp(t, c).Result))
	_, err := a.Read(context.Background())
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, h.m.Close())
	require.Equal(t, int32(1), u.closes.Load())
	require.Equal(t, int32(1), u2.closes.Load())
}

// TestMuxClose: Mux.Close ends the shared connection (its closer called once), every
// connection reads io.EOF and cannot write, Open is refused; Close again is fine.
func TestMuxClose(t *testing.T) {
	h := newMux(t, true)
	a, b := h.open(t), h.open(t)
	u := h.up(t)
	require.NoError(t, h.m.Close())
	require.Equal(t, int32(1), u.closes.Load())
	for _, c := range []*muxConn{a, b} {
		_, err := c.Read(context.Background())
		require.ErrorIs(t, err, io.EOF)
		require.Error(t, c.Write(context.Background(), call(float64(1), "tools/list", "")))
	}
	_, _, err := h.m.Open(context.Background())
	require.Error(t, err)
	require.NoError(t, h.m.Close())
	require.Equal(t, int32(1), u.closes.Load())
	require.Zero(t, h.m.Conns())
	require.Equal(t, 1, h.dials())
}

// TestMuxDial: concurrent Opens dial once; a failed dial is Open's error and the next
// Open dials again; without Dial, Open is an error naming it.
func TestMuxDial(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	defer goleak.VerifyNone(t, ignore)
	_, _, err := new(Mux).Open(context.Background())
	require.ErrorContains(t, err, "Mux.Dial is nil")
	var dials atomic.Int32
	boom := errors.New("boom")
	var ups []*fakeUpstream
	m := &Mux{Dial: func(context.Context) (mcp.Connection, io.Closer, error) {
		if dials.Add(1) == 1 {
			return nil, nil, boom
		}
		conn, u := newFakeUpstream()
		ups = append(ups, u)
		return conn, nil, nil
	}}
	_, _, err = m.Open(context.Background())
	require.ErrorIs(t, err, boom)
	require.Zero(t, m.Conns())
	var wg sync.WaitGroup
	conns := make([]mcp.Connection, 8)
	for i := range conns {
		wg.Go(func() {
			c, _, err := m.Open(context.Background())
			if err == nil {
				conns[i] = c
			}
		})
	}
	wg.Wait()
	require.Equal(t, int32(2), dials.Load())
	require.Equal(t, len(conns), m.Conns())
	for _, c := range conns {
		require.NotNil(t, c)
		require.NoError(t, c.Close())
	}
	require.Zero(t, m.Conns())
	require.NoError(t, m.Close())
	for _, u := range ups {
		u.hangUp()
		<-u.done
	}
}

// TestMuxInMemory: the mux works over the SDK's in-memory transport as the upstream.
func TestMuxInMemory(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	defer goleak.VerifyNone(t, ignore)
	ctx := context.Background()
	mine, theirs := mcp.NewInMemoryTransports()
	server, err := theirs.Connect(ctx)
	require.NoError(t, err)
	m := &Mux{Dial: func(ctx context.Context) (mcp.Connection, io.Closer, error) {
		c, err := mine.Connect(ctx)
		return c, nil, err
	}}
	a, _, err := m.Open(ctx)
	require.NoError(t, err)
	b, _, err := m.Open(ctx)
	require.NoError(t, err)
	require.NoError(t, a.Write(ctx, call(float64(1), "tools/list", "")))
	ra, err := server.Read(ctx)
	require.NoError(t, err)
	require.NoError(t, b.Write(ctx, call(float64(1), "tools/list", "")))
	rb, err := server.Read(ctx)
	require.NoError(t, err)
	require.NoError(t, server.Write(ctx, result(rb.(*jsonrpc.Request).ID, `{"who":"b"}`)))
	require.NoError(t, server.Write(ctx, result(ra.(*jsonrpc.Request).ID, `{"who":"a"}`)))
	require.JSONEq(t, `{"who":"a"}`, string(readResp(t, a).Result))
	require.JSONEq(t, `{"who":"b"}`, string(readResp(t, b).Result))
	require.NoError(t, m.Close())
	require.NoError(t, server.Close())
	_, err = a.Read(ctx)
	require.ErrorIs(t, err, io.EOF)
}

// TestMuxConcurrent: many connections, each with many requests in flight at once under the
// same ids, each with a progress token; upstream answers in batches, in reverse. Every
// connection gets exactly its own progress and answers, and once all are answered no
// connection remembers a route; once all are closed the mux holds none.
func TestMuxConcurrent(t *testing.T) {
	const conns, reqs, batch = 16, 50, 7
	h := newMux(t, true)
	cs := make([]*muxConn, conns)
	for k := range cs {
		cs[k] = h.open(t)
	}
	u := h.up(t)
	errs := make(chan error, conns+1)
	go func() { errs <- serveReverse(u, conns*reqs, batch) }()
	var wg sync.WaitGroup
	for k, c := range cs {
		wg.Go(func() { errs <- exchange(c, k, reqs) })
	}
	wg.Wait()
	for range conns + 1 {
		require.NoError(t, <-errs)
	}
	for _, c := range cs {
		require.Zero(t, routes(c), "answered requests are forgotten")
	}
	h.fence(t, u, cs...)
	for _, c := range cs {
		require.NoError(t, c.Close())
	}
	require.Zero(t, h.m.Conns())
}

// exchange sends reqs requests on c (ids 0…reqs-1, progress token i) and checks that it
// reads, for each, one progress notification and one answer, both its own.
func exchange(c *muxConn, k, reqs int) error {
	ctx, cancel := context.WithTimeout(context.Background(), muxWait)
	defer cancel()
	for i := range reqs {
		params := fmt.Sprintf(`{"c":%d,"i":%d,"_meta":{"progressToken":%d}}`, k, i, i)
		if err := c.Write(ctx, call(float64(i), "tools/call", params)); err != nil {
			return err
		}
	}
	progress, answers := map[int64]bool{}, map[int64]bool{}
	for range 2 * reqs {
		m, err := c.Read(ctx)
		if err != nil {
			return fmt.Errorf("connection %d: %w", k, err)
		}
		var echo struct{ C, I int64 }
		var seen map[int64]bool
		var id int64
		switch m := m.(type) {
		case *jsonrpc.Response:
			id, _ = m.ID.Raw().(int64)
			seen = answers
			_ = json.Unmarshal(m.Result, &echo)
		case *jsonrpc.Request:
			var p struct {
				Token int64 `json:"progressToken"`
				Echo  struct{ C, I int64 }
			}
			_ = json.Unmarshal(m.Params, &p)
			id, echo, seen = p.Token, p.Echo, progress
		}
		if echo.C != int64(k) || echo.I != id || seen[id] {
			return fmt.Errorf("connection %d got %#v (echo %+v, twice: %v)", k, m, echo, seen[id])
		}
		seen[id] = true
	}
	if len(progress) != reqs || len(answers) != reqs {
		return fmt.Errorf("connection %d: %d progress, %d answers", k, len(progress), len(answers))
	}
	return nil
}

// serveReverse answers n requests: in batches of batch (the last may be short), in
// reverse, each a progress notification (echoing c and i) then the answer (the same).
func serveReverse(u *fakeUpstream, n, batch int) error {
	var pending []*jsonrpc.Request
	for done := 0; done < n; {
		select {
		case m := <-u.got:
			r, ok := m.(*jsonrpc.Request)
			if !ok || !r.IsCall() {
				return fmt.Errorf("upstream got %#v", m)
			}
			pending = append(pending, r)
		case <-time.After(muxWait):
			return errors.New("upstream: no request")
		}
		if len(pending) < batch && done+len(pending) < n {
			continue
		}
		for i := len(pending) - 1; i >= 0; i-- {
			r := pending[i]
			var p struct {
				C, I int64
				Meta struct {
					Token string `json:"progressToken"`
				} `json:"_meta"`
			}
			if err := json.Unmarshal(r.Params, &p); err != nil {
				return err
			}
			echo := fmt.Sprintf(`{"c":%d,"i":%d}`, p.C, p.I)
			for _, m := range []jsonrpc.Message{
				notification("notifications/progress", fmt.Sprintf(`{"progressToken":%q,"echo":%s}`, p.Meta.Token, echo)),
				result(r.ID, echo),
			} {
				if err := u.conn.Write(context.Background(), m); err != nil {
					return err
				}
			}
		}
		done += len(pending)
		pending = pending[:0]
	}
	return nil
}

// TestMuxSlowConnection: a connection that reads nothing stalls no other connection, nor
// Mux.Close: past muxMaxNotes notifications queued for it, the next are dropped, its
// answers never are (there is at most one per request it sent).
func TestMuxSlowConnection(t *testing.T) {
	h := newMux(t, true)
	a, b := h.open(t), h.open(t)
	u := h.up(t)
	require.NoError(t, a.Write(context.Background(), call(float64(1), "tools/call", `{"_meta":{"progressToken":"p"}}`)))
	ra := u.nextReq(t)
	require.NoError(t, b.Write(context.Background(), call(float64(1), "tools/call", `{}`)))
	rb := u.nextReq(t)
	token := rewritten(t, ra.Params, "_meta.progressToken")
	sent := make(chan error, 1)
	go func() { // the pipe blocks these writes while the mux does not read
		for i := range 3 * muxMaxNotes {
			if err := u.conn.Write(context.Background(), notification("notifications/progress", fmt.Sprintf(`{"progressToken":%q,"progress":%d}`, token, i))); err != nil {
				sent <- err
				return
			}
		}
		sent <- u.conn.Write(context.Background(), result(ra.ID, `{"who":"a"}`))
	}()
	select {
	case err := <-sent:
		require.NoError(t, err)
	case <-time.After(muxWait):
		t.Fatal("the mux stopped reading upstream: a connection that does not read stalls all")
	}
	u.send(t, result(rb.ID, `{"who":"b"}`))
	require.JSONEq(t, `{"who":"b"}`, string(readResp(t, b).Result), "a connection that does not read stalls another")
	for i := range muxMaxNotes {
		require.JSONEq(t, fmt.Sprintf(`{"progressToken":"p","progress":%d}`, i), string(readNote(t, a).Params))
	}
	require.JSONEq(t, `{"who":"a"}`, string(readResp(t, a).Result))
	h.fence(t, u, a, b)

	// Full again, unread: Close ends all the same.
	require.NoError(t, a.Write(context.Background(), call(float64(2), "tools/call", `{"_meta":{"progressToken":"q"}}`)))
	token = rewritten(t, u.nextReq(t).Params, "_meta.progressToken")
	for i := range 2 * muxMaxNotes {
		u.send(t, notification("notifications/progress", fmt.Sprintf(`{"progressToken":%q,"progress":%d}`, token, i)))
	}
	h.fence(t, u, b)
	require.NoError(t, h.m.Close())
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

// TestMuxCloseCancels: closing a connection forgets its requests in flight and cancels
// them upstream, in the order they were sent (as its own upstream connection's end would
// have ended them: a listen stream must not outlive its listener in the shared server);
// answered requests are not cancelled.
func TestMuxCloseCancels(t *testing.T) {
	h := newMux(t, true)
	a, b := h.open(t), h.open(t)
	u := h.up(t)
	var sent []*jsonrpc.Request
	for i, method := range []string{"subscriptions/listen", "tools/call", "resources/read"} {
		require.NoError(t, a.Write(context.Background(), call(float64(i), method, `{}`)))
		sent = append(sent, u.nextReq(t))
	}
	u.send(t, result(sent[1].ID, `{}`))
	require.Equal(t, int64(1), readResp(t, a).ID.Raw())
	require.NoError(t, a.Close())
	require.Zero(t, routes(a), "a closed connection remembers no request")
	for _, r := range []*jsonrpc.Request{sent[0], sent[2]} {
		n := u.nextReq(t)
		require.Equal(t, "notifications/cancelled", n.Method)
		require.False(t, n.IsCall())
		require.JSONEq(t, fmt.Sprintf(`{"requestId":%q,"reason":"the connection closed"}`, r.ID.Raw()), string(n.Params))
	}
	require.NoError(t, a.Close())
	h.fence(t, u, b)
}

// failWrites fails the Writes of requests of method "fail".
type failWrites struct{ mcp.Connection }

func (f failWrites) Write(ctx context.Context, m jsonrpc.Message) error {
	if r, ok := m.(*jsonrpc.Request); ok && r.Method == "fail" {
		return errors.New("write failed")
	}
	return f.Connection.Write(ctx, m)
}

// TestMuxFailedWrite: a request that could not be written upstream is Write's error and
// is not remembered; the connection goes on.
func TestMuxFailedWrite(t *testing.T) {
	h := newMux(t, true)
	h.wrap = func(c mcp.Connection) mcp.Connection { return failWrites{c} }
	a := h.open(t)
	u := h.up(t)
	require.Error(t, a.Write(context.Background(), call(float64(1), "fail", `{"_meta":{"progressToken":1}}`)))
	require.Zero(t, routes(a))
	h.fence(t, u, a)
}

// TestMuxTaskScope: every shared connection has a task scope of its own, never one an
// earlier shared connection had (its task ids, recorded in the ledger as handles, mean
// nothing to a new child), even once the earlier one is collected; its connections share
// it.
func TestMuxTaskScope(t *testing.T) {
	h := newMux(t, true)
	seen := map[string]bool{}
	for range 50 {
		a, b := h.open(t), h.open(t)
		require.NotEmpty(t, a.TaskScope())
		require.Equal(t, a.TaskScope(), b.TaskScope())
		require.False(t, seen[a.TaskScope()], "scope %s again", a.TaskScope())
		seen[a.TaskScope()] = true
		h.up(t).hangUp()
		_, err := a.Read(context.Background())
		require.ErrorIs(t, err, io.EOF)
		h.mu.Lock()
		h.conns = nil // let the ended shared connection be collected
		h.mu.Unlock()
		runtime.GC()
	}
}
