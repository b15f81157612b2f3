package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

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
