package mcpproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// resumeRig serves one host session's downConn (or a stateless request's) over HTTP; the
// test plays the relay: it reads what the host posted from c and writes answers to c.
type resumeRig struct {
	c    *downConn
	srv  *httptest.Server
	logs *syncBuffer
}

func newResumeRig(t *testing.T, stateless bool) *resumeRig {
	t.Helper()
	logs := &syncBuffer{}
	c := newDownConn("s1", slog.New(slog.NewTextHandler(logs, nil)))
	c.stateless = stateless
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			c.serveGET(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		msgs, err := transport.DecodeMessages(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.servePOST(w, r, msgs, false, func() {})
	}))
	t.Cleanup(func() {
		c.Close()
		srv.Close()
	})
	return &resumeRig{c: c, srv: srv, logs: logs}
}

// post sends a tools/call with id 1 under protocol version rev (a header) and returns the
// response, once the relay has read the request (and, when answer is not nil, called it).
func (r *resumeRig) post(t *testing.T, ctx context.Context, rev string, answer func()) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.srv.URL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge"}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if rev != "" {
		req.Header.Set("Mcp-Protocol-Version", rev)
	}
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() { // a stateless stream's headers wait for its first message
		resp, err := http.DefaultClient.Do(req)
		done <- result{resp, err}
	}()
	got, err := r.c.Read(ctx)
	require.NoError(t, err)
	require.Equal(t, "tools/call", got.(*jsonrpc.Request).Method)
	if answer != nil {
		answer()
	}
	res := <-done
	require.NoError(t, res.err)
	return res.resp
}

// answer writes upstream's answer to request 1.
func (r *resumeRig) answer(t *testing.T) {
	t.Helper()
	id, _ := jsonrpc.MakeID(float64(1))
	require.NoError(t, r.c.Write(t.Context(), &jsonrpc.Response{ID: id, Result: json.RawMessage(`{"content":[]}`)}))
}

// get sends a GET with Last-Event-ID last.
func (r *resumeRig) get(t *testing.T, last string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, r.srv.URL, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Last-Event-ID", last)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// readEvent reads one server-sent event (its lines) from br.
func readEvent(t *testing.T, br *bufio.Reader) []string {
	t.Helper()
	var lines []string
	for {
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			return lines
		}
		lines = append(lines, line)
	}
}

// The events of a session's streams carry ids ("stream_index"); a stream of a 2025-11-25
// host starts with a priming event (id, retry, no data), one of an older host does not;
// a stateless (2026-07-28) request's stream has neither ids nor retry (SEP-2575).
func TestHTTPStreamEventIDsAndPriming(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		stateless bool
		rev       string
		want      string
	}{
		{"2025-11-25 session", false, "2025-11-25", "id: 1_0\nretry: 1000\ndata: \n\nid: 1_1\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[]}}\n\n"},
		{"2025-06-18 session", false, "2025-06-18", "id: 1_1\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[]}}\n\n"},
		{"stateless", true, "2026-07-28", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[]}}\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newResumeRig(t, tc.stateless)
			resp := r.post(t, t.Context(), tc.rev, func() { r.answer(t) })
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, tc.want, string(body))
		})
	}
}

// A host whose connection drops after the priming event resumes the stream with a GET
// carrying its id: the answer that came meanwhile is replayed with its id, and the stream
// (complete now) stays resumable from any event it still holds; an id it no longer holds,
// of no stream, or not the proxy's gets 400 (not 404: the session lives on).
func TestHTTPStreamResumesFromLastEventID(t *testing.T) {
	t.Parallel()
	r := newResumeRig(t, false)
	ctx, drop := context.WithCancel(t.Context())
	resp := r.post(t, ctx, "2025-11-25", nil)
	br := bufio.NewReader(resp.Body)
	require.Equal(t, []string{"id: 1_0", "retry: 1000", "data: "}, readEvent(t, br))
	drop() // the host's connection drops
	resp.Body.Close()
	require.Eventually(t, func() bool {
		r.c.mu.Lock()
		defer r.c.mu.Unlock()
		return len(r.c.retained) == 1
	}, 10*time.Second, time.Millisecond, "the stream is kept without its connection")
	r.answer(t) // queued on the stream without a connection
	answer := []string{"id: 1_1", "event: message", `data: {"jsonrpc":"2.0","id":1,"result":{"content":[]}}`}

	for range 2 { // resumable again after a resumption, from the same id
		got := r.get(t, "1_0")
		require.Equal(t, http.StatusOK, got.StatusCode)
		require.Equal(t, "s1", got.Header.Get("Mcp-Session-Id"))
		rest, err := io.ReadAll(got.Body)
		require.NoError(t, err, "the stream ends once complete")
		require.Equal(t, strings.Join(answer, "\n")+"\n\n", string(rest))
	}
	got := r.get(t, "1_1")
	rest, err := io.ReadAll(got.Body)
	require.NoError(t, err)
	require.Empty(t, string(rest), "nothing after the answer")

	for last, why := range map[string]string{
		"9_0":   "holds no stream of it",
		"x":     "not an event id of this proxy",
		"1_5":   "no such event yet",
		"1_-1":  "not an event id of this proxy",
		"01_a0": "not an event id of this proxy",
	} {
		got := r.get(t, last)
		require.Equal(t, http.StatusBadRequest, got.StatusCode, last)
		body, _ := io.ReadAll(got.Body)
		require.Contains(t, string(body), why, last)
	}
}

// A stream keeps what its writers took while it fits the stream's bounds, beside what it
// queues: the oldest events go first, and a resumption from before them is refused; one
// from an event still held replays exactly the events after it.
func TestHTTPStreamReplayIsBounded(t *testing.T) {
	t.Parallel()
	st := &sseStream{signal: make(chan struct{}, 1), stop: make(chan struct{}), num: 1, get: true, attached: true}
	for i := range maxStreamMessages + 10 {
		require.Equal(t, pushed, st.push([]byte(`{"n":`+itoa(i)+`}`), "", true))
		q, _ := st.take(0)
		require.Len(t, q, 1)
	}
	st.mu.Lock()
	require.LessOrEqual(t, len(st.log), maxStreamMessages)
	require.Equal(t, 10, st.trimmed, "events 1..10 were dropped to keep the bound")
	st.mu.Unlock()
	_, why := st.resume(5)
	require.Contains(t, why, "no longer held")
	gen, why := st.resume(maxStreamMessages + 8)
	require.Empty(t, why)
	q, _ := st.take(gen)
	require.Len(t, q, 2, "the two events after it")
	require.Equal(t, maxStreamMessages+9, q[0].idx)
	require.Equal(t, `{"n":`+itoa(maxStreamMessages+9)+`}`, string(q[1].data))
	select {
	case <-st.stop:
		t.Fatal("the new writer's stop channel is closed")
	default:
	}
}

// A session keeps at most maxRetained streams without a connection (and maxStreamBytes in
// all): the oldest are forgotten, and answers they still held are logged as dropped.
func TestHTTPStreamRetainedAreBounded(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	c := newDownConn("s1", slog.New(slog.NewTextHandler(logs, nil)))
	var first *sseStream
	for i := range maxRetained + 4 {
		st := newStream()
		c.mu.Lock()
		c.resumable(st, httptest.NewRequest(http.MethodPost, "/", nil))
		id, _ := jsonrpc.MakeID(float64(i))
		st.waiting[hostKey(id)] = true
		c.byRequest[hostKey(id)] = st
		c.mu.Unlock()
		if first == nil {
			first = st
			require.NoError(t, c.Write(t.Context(), &jsonrpc.Response{ID: id, Result: json.RawMessage(`{}`)}))
		}
		c.detach(st, 0)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Len(t, c.retained, maxRetained)
	require.NotContains(t, c.retained, first)
	require.NotContains(t, c.streams, first.num)
	require.Contains(t, logs.String(), "answers for the host were dropped")
}
