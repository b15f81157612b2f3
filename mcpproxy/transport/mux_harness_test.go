package transport

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
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
