package mcpproxy

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// streamRig is a host session over HTTP with a GET stream and one POST stream waiting for
// the answer to request 1, neither of which has a writer: the host never reads them.
type streamRig struct {
	c         *downConn
	get, post *sseStream
	logs      *syncBuffer
}

func newStreamRig(t *testing.T, withGET bool) *streamRig {
	t.Helper()
	logs := &syncBuffer{}
	c := newDownConn("s1", slog.New(slog.NewTextHandler(logs, nil)))
	r := &streamRig{c: c, logs: logs}
	if withGET {
		r.get = newStream()
		r.get.waiting = nil // a GET stream: never complete
		c.standalone = r.get
	}
	r.post = newStream()
	id, _ := jsonrpc.MakeID(float64(1))
	k := hostKey(id)
	r.post.waiting[k] = true
	c.byRequest[k] = r.post
	c.recent = append(c.recent, r.post)
	return r
}

// notify writes n upstream notifications of about size bytes each to the host.
func (r *streamRig) notify(t *testing.T, n, size int) {
	t.Helper()
	params, _ := json.Marshal(map[string]any{"level": "info", "data": strings.Repeat("x", size)})
	for range n {
		require.NoError(t, r.c.Write(t.Context(), &jsonrpc.Request{Method: "notifications/message", Params: params}))
	}
}

func (r *streamRig) answer(t *testing.T) {
	t.Helper()
	id, _ := jsonrpc.MakeID(float64(1))
	require.NoError(t, r.c.Write(t.Context(), &jsonrpc.Response{ID: id, Result: json.RawMessage(`{"content":[]}`)}))
}

// held is what st holds for the host: messages and bytes.
func held(st *sseStream) (n, size int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, e := range st.queue {
		size += len(e.data)
	}
	return len(st.queue), size
}

// A GET stream the host never reads holds at most maxStreamMessages notifications and
// maxStreamBytes; the rest are dropped, logged once, and counted when the stream ends. A
// request still gets its answer on its own POST stream.
func TestHTTPStreamQueueIsBounded(t *testing.T) {
	t.Parallel()
	t.Run("messages", func(t *testing.T) {
		t.Parallel()
		r := newStreamRig(t, true)
		r.notify(t, 5000, 100)
		n, size := held(r.get)
		require.Equal(t, maxStreamMessages, n)
		require.LessOrEqual(t, size, maxStreamBytes)
		require.Equal(t, 1, strings.Count(r.logs.String(), "notifications for the host are dropped"), r.logs.String())

		r.answer(t)
		q, complete := r.post.take(0)
		require.Len(t, q, 1, "the POST stream carries its answer, and nothing else")
		require.Contains(t, string(q[0].data), `"id":1`)
		require.True(t, complete)

		r.c.forget(r.get)
		require.Contains(t, r.logs.String(), "dropped="+itoa(5000-maxStreamMessages))
	})
	t.Run("bytes", func(t *testing.T) {
		t.Parallel()
		r := newStreamRig(t, true)
		r.notify(t, 200, 100<<10)
		n, size := held(r.get)
		require.LessOrEqual(t, size, maxStreamBytes)
		require.Greater(t, size, maxStreamBytes-(101<<10), "filled up to the bound")
		require.Less(t, n, 200)
	})
	t.Run("an answer takes the place of queued notifications", func(t *testing.T) {
		t.Parallel()
		r := newStreamRig(t, false) // no GET stream: notifications go to the POST stream
		r.notify(t, 5000, 100)
		n, _ := held(r.post)
		require.Equal(t, maxStreamMessages, n)
		r.answer(t)
		q, complete := r.post.take(0)
		require.Len(t, q, 1, "the queued notifications were dropped for the answer")
		require.Contains(t, string(q[0].data), `"id":1`)
		require.True(t, complete)
		require.Equal(t, 5000, r.post.droppedCount(), "every notification is counted, queued ones included")
	})
	t.Run("an answer that does not fit ends its stream, keeping what it queued", func(t *testing.T) {
		t.Parallel()
		r := newStreamRig(t, false)
		for i := range maxStreamMessages { // requests of upstream (sampling, roots): never dropped
			id, _ := jsonrpc.MakeID("up-" + itoa(i))
			require.NoError(t, r.c.Write(t.Context(), &jsonrpc.Request{ID: id, Method: "roots/list", Params: json.RawMessage(`{}`)}))
		}
		n, _ := held(r.post)
		require.Equal(t, maxStreamMessages, n)
		r.answer(t)
		select {
		case <-r.post.stop:
		default:
			t.Fatal("a writer blocked on the host is not told to stop")
		}
		require.Contains(t, r.logs.String(), "an answer for the host was dropped and its stream ended")
		r.c.forget(r.post)
		r.c.mu.Lock()
		pending := len(r.c.pending)
		r.c.mu.Unlock()
		require.Equal(t, maxStreamMessages, pending, "the requests it queued wait for the next stream")
	})
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// A GET stream over HTTP whose host never reads it ends when a message that may not be
// dropped (a request of upstream) finds its queue full of such messages, even though its
// writer is blocked writing to the host: the handler returns, the session forgets the
// stream, and the requests it did not send wait for the next one.
func TestHTTPStreamThatOverflowsCloses(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	c := newDownConn("s1", slog.New(slog.NewTextHandler(logs, nil)))
	srv := httptest.NewServer(http.HandlerFunc(c.serveGET))
	defer srv.Close()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close() // never read
	require.Equal(t, http.StatusOK, resp.StatusCode)

	open := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.standalone != nil
	}
	require.Eventually(t, open, 5*time.Second, time.Millisecond)
	params, _ := json.Marshal(map[string]any{"data": strings.Repeat("x", 1<<20)})
	const n = 64 // more than the socket buffers, the writer's batch and the queue hold
	for i := range n {
		id, _ := jsonrpc.MakeID("s" + itoa(i))
		require.NoError(t, c.Write(t.Context(), &jsonrpc.Request{ID: id, Method: "sampling/createMessage", Params: params}))
	}
	require.Eventually(t, func() bool { return !open() }, 10*time.Second, 10*time.Millisecond, "the stream's handler did not return: %s", logs)
	require.Contains(t, logs.String(), "a stream to the host was ended")
	c.mu.Lock()
	defer c.mu.Unlock()
	require.NotEmpty(t, c.pending, "the requests not sent wait for the next stream")
	var ids []any
	for _, data := range c.pending {
		m, err := jsonrpc.DecodeMessage(data)
		require.NoError(t, err)
		ids = append(ids, m.(*jsonrpc.Request).ID.Raw())
	}
	require.Contains(t, ids, "s"+itoa(n-1), "the last request, sent after the stream ended, waits")
}

// The proxy's answer to a request whose resumable stream lost its connection is kept for
// the host to resume, but does not count as the host's (WriteAnswer false): the host may
// never read it, so its identical call is a retry, not a new intent (repeat.go).
func TestWriteAnswerToDetachedStreamIsNotDelivered(t *testing.T) {
	id, _ := jsonrpc.MakeID(float64(1))
	answer := &jsonrpc.Response{ID: id, Result: json.RawMessage(`{"content":[]}`)}
	for _, attached := range []bool{true, false} {
		r := newStreamRig(t, false)
		r.post.num, r.post.attached = 1, attached // resumable; a writer reads it, or none since the drop
		r.c.streams[1] = r.post
		require.Equal(t, attached, r.c.WriteAnswer(t.Context(), answer, nil), "attached %v", attached)
		n, _ := held(r.post)
		require.Equal(t, 1, n, "kept for the host either way (attached %v)", attached)
	}
	r := newStreamRig(t, false) // a stream without ids: it lives as long as its request
	require.True(t, r.c.WriteAnswer(t.Context(), answer, nil))
}

// A request whose stream ended while its answer was still due (the host cancelled or
// closed it) is logged once, and its answer, when it comes, is dropped without being
// counted as the host's: WriteAnswer returns false and never calls delivered. A stream the
// proxy ended itself (overflow), a session that ended, and a request that was answered are
// not logged; an answer with a stream the host reads calls delivered before it is queued.
func TestAbandonedRequestIsLoggedAndItsAnswerNotDelivered(t *testing.T) {
	const line = "the host stopped waiting for answers"
	id, _ := jsonrpc.MakeID(float64(1))
	answer := func() *jsonrpc.Response {
		return &jsonrpc.Response{ID: id, Result: json.RawMessage(`{"content":[]}`)}
	}

	r := newStreamRig(t, false)
	r.c.detach(r.post, 0) // its request returned: the host went away
	require.Equal(t, 1, strings.Count(r.logs.String(), line), r.logs.String())
	called := false
	require.False(t, r.c.WriteAnswer(t.Context(), answer(), func() { called = true }))
	require.False(t, called, "delivered called for an answer nobody waits for")

	r = newStreamRig(t, false)
	r.post.ended = true // the proxy ended it (its queue overflowed)
	r.c.detach(r.post, 0)
	require.NotContains(t, r.logs.String(), line)

	r = newStreamRig(t, false)
	require.NoError(t, r.c.Close()) // the session ended
	r.c.detach(r.post, 0)
	require.NotContains(t, r.logs.String(), line)

	r = newStreamRig(t, false)
	var queued int
	require.True(t, r.c.WriteAnswer(t.Context(), answer(), func() { queued, _ = held(r.post) }))
	require.Equal(t, 0, queued, "delivered is called before the answer is queued")
	n, _ := held(r.post)
	require.Equal(t, 1, n)
	r.c.detach(r.post, 0)
	require.NotContains(t, r.logs.String(), line, "an answered request is not abandoned")
}
