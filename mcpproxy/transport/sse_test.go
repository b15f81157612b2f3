package transport_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// pollingServer is a streamable-HTTP upstream that answers a tools/call POST with an SSE
// stream holding only events (a priming event, say) and closes it, then answers the GETs
// that resume it from script, one per GET, recording when each came and its
// Last-Event-ID. A GET without Last-Event-ID (the notification stream) gets 405.
type pollingServer struct {
	srv    *httptest.Server
	post   string   // the POST stream's events (raw SSE)
	script []string // each resuming GET's events; past the end: 400
	status int      // when set, every resuming GET gets it

	mu      sync.Mutex
	closed  time.Time // when the POST stream was closed
	gets    []time.Time
	lastIDs []string
	session []string // Mcp-Session-Id of each resuming GET
}

func newPollingServer(t *testing.T, post string, script ...string) *pollingServer {
	t.Helper()
	p := &pollingServer{post: post, script: script}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *pollingServer) serve(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
		body, _ := io.ReadAll(r.Body)
		msg, err := jsonrpc.DecodeMessage(body)
		if req, ok := msg.(*jsonrpc.Request); err != nil || !ok || !req.IsCall() {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Mcp-Session-Id", "sess-1")
		_, _ = io.WriteString(w, p.post)
		w.(http.Flusher).Flush()
		p.mu.Lock()
		p.closed = time.Now()
		p.mu.Unlock()
	case http.MethodGet:
		last, resuming := r.Header["Last-Event-Id"]
		if !resuming {
			http.Error(w, "no notification stream", http.StatusMethodNotAllowed)
			return
		}
		p.mu.Lock()
		n := len(p.gets)
		p.gets = append(p.gets, time.Now())
		p.lastIDs = append(p.lastIDs, last[0])
		p.session = append(p.session, r.Header.Get("Mcp-Session-Id"))
		p.mu.Unlock()
		if p.status != 0 || n >= len(p.script) {
			http.Error(w, "cannot replay", max(p.status, http.StatusBadRequest))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, p.script[n])
	}
}

// record returns what the server saw: the delay of each resuming GET after the POST
// stream closed, their Last-Event-IDs and session ids.
func (p *pollingServer) record() (delays []time.Duration, lastIDs, sessions []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range p.gets {
		delays = append(delays, g.Sub(p.closed))
	}
	return delays, append([]string(nil), p.lastIDs...), append([]string(nil), p.session...)
}

// call sends a tools/call with id 7 (params as given) on conn and returns its answer.
func call(t *testing.T, conn interface {
	Write(context.Context, jsonrpc.Message) error
	Read(context.Context) (jsonrpc.Message, error)
}, params string) *jsonrpc.Response {
	t.Helper()
	id, _ := jsonrpc.MakeID(float64(7))
	require.NoError(t, conn.Write(context.Background(), &jsonrpc.Request{ID: id, Method: "tools/call", Params: json.RawMessage(params)}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		msg, err := conn.Read(ctx)
		require.NoError(t, err)
		if r, ok := msg.(*jsonrpc.Response); ok && r.ID == id {
			return r
		}
	}
}

// answerEvent is an SSE event holding the answer to request 7.
func answerEvent(id string) string {
	return fmt.Sprintf("id: %s\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"done\"}]}}\n\n", id)
}

func dial(t *testing.T, url string) interface {
	Write(context.Context, jsonrpc.Message) error
	Read(context.Context) (jsonrpc.Message, error)
} {
	t.Helper()
	conn, err := transport.DialUpstream(context.Background(), url, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// A POST stream that the upstream closes after its priming event (id, retry 300 ms) is
// resumed: the proxy waits the retry time, sends GET with the priming event's id as
// Last-Event-ID and the session's id, and delivers the answer the resumed stream carries,
// not a made-up CodeUpstreamHTTP error.
func TestHTTPUpstreamResumesAStreamClosedAfterPriming(t *testing.T) {
	t.Parallel()
	p := newPollingServer(t, "id: s1_0\nretry: 300\ndata: \n\n", "id: s1_1\ndata: \n\n"+answerEvent("s1_2"))
	resp := call(t, dial(t, p.srv.URL), `{"name":"charge","arguments":{}}`)
	require.Nil(t, resp.Error)
	require.JSONEq(t, `{"content":[{"type":"text","text":"done"}]}`, string(resp.Result))
	delays, ids, sessions := p.record()
	require.Equal(t, []string{"s1_0"}, ids)
	require.Equal(t, []string{"sess-1"}, sessions)
	require.GreaterOrEqual(t, delays[0], 300*time.Millisecond, "the reconnection waited the stream's retry")
}

// A stream resumed more than once: each resumption carries the newest event id seen, and
// each waits the retry time the upstream set last.
func TestHTTPUpstreamResumesAgainWithTheNewestEventID(t *testing.T) {
	t.Parallel()
	p := newPollingServer(t, "id: a\nretry: 50\ndata: \n\n",
		"id: b\nretry: 200\ndata: \n\n", // progress, then closed again
		answerEvent("c"))
	resp := call(t, dial(t, p.srv.URL), `{"name":"charge"}`)
	require.Nil(t, resp.Error)
	delays, ids, _ := p.record()
	require.Equal(t, []string{"a", "b"}, ids)
	require.GreaterOrEqual(t, delays[0], 50*time.Millisecond)
	require.GreaterOrEqual(t, delays[1]-delays[0], 200*time.Millisecond, "the second wait is the newer retry")
}

// Streams that cannot be resumed end in the CodeUpstreamHTTP answer (an unknown outcome
// for a protected call), saying why: no event id, a stateless (2026-07-28) request, an
// upstream that refuses the Last-Event-ID, one that asks to wait longer than MaxRetry.
func TestHTTPUpstreamStreamsThatCannotResume(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, post, params string
		status             int
		gets               int
		want               string
	}{
		{"no event id", "retry: 10\ndata: \n\n", `{"name":"charge"}`, 0, 0, "without an event id to resume it from"},
		{"stateless", "id: s1_0\nretry: 10\ndata: \n\n",
			`{"name":"charge","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}`, 0, 0, "a stateless request's stream is not resumed"},
		{"refused", "id: s1_0\nretry: 10\ndata: \n\n", `{"name":"charge"}`, http.StatusBadRequest, 1, `Last-Event-ID "s1_0": HTTP status 400`},
		{"retry too long", "id: s1_0\nretry: 3600000\ndata: \n\n", `{"name":"charge"}`, 0, 0, "longer than the proxy waits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newPollingServer(t, tc.post, answerEvent("s1_1"))
			p.status = tc.status
			resp := call(t, dial(t, p.srv.URL), tc.params)
			var we *jsonrpc.Error
			require.ErrorAs(t, resp.Error, &we)
			require.EqualValues(t, transport.CodeUpstreamHTTP, we.Code)
			require.Contains(t, we.Message, tc.want)
			_, ids, _ := p.record()
			require.Len(t, ids, tc.gets)
		})
	}
}

// Resumption is bounded: MaxResumes attempts in a row that bring no new event end it.
func TestHTTPUpstreamResumptionGivesUp(t *testing.T) {
	t.Parallel()
	p := newPollingServer(t, "id: s1_0\nretry: 1\ndata: \n\n")
	p.status = http.StatusServiceUnavailable
	conn, err := transport.DialUpstream(context.Background(), p.srv.URL, nil)
	require.NoError(t, err)
	defer conn.Close()
	transport.SetBackoff(conn, time.Millisecond)
	resp := call(t, conn, `{"name":"charge"}`)
	var we *jsonrpc.Error
	require.ErrorAs(t, resp.Error, &we)
	require.Contains(t, we.Message, fmt.Sprintf("%d attempts in a row", transport.MaxResumes))
	_, ids, _ := p.record()
	require.Len(t, ids, transport.MaxResumes)
}

// A request cancelled (notifications/cancelled: the host's, or the proxy's at a protected
// call's timeout) while its stream waits to be resumed is not resumed.
func TestHTTPUpstreamCancelledRequestIsNotResumed(t *testing.T) {
	t.Parallel()
	p := newPollingServer(t, "id: s1_0\nretry: 60000\ndata: \n\n", answerEvent("s1_1"))
	conn := dial(t, p.srv.URL)
	id, _ := jsonrpc.MakeID(float64(7))
	require.NoError(t, conn.Write(context.Background(), &jsonrpc.Request{ID: id, Method: "tools/call", Params: json.RawMessage(`{"name":"charge"}`)}))
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return !p.closed.IsZero()
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, conn.Write(context.Background(), &jsonrpc.Request{Method: "notifications/cancelled", Params: json.RawMessage(`{"requestId":7}`)}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg, err := conn.Read(ctx)
	require.NoError(t, err, "the cancelled request is answered at once, not after the 60 s retry")
	resp := msg.(*jsonrpc.Response)
	var we *jsonrpc.Error
	require.ErrorAs(t, resp.Error, &we)
	require.Contains(t, we.Message, "cancelled before it was resumed")
	_, ids, _ := p.record()
	require.Empty(t, ids)
}

// The notification stream (GET) is resumed like a request's: after the retry time it
// set, with the newest event id as Last-Event-ID; an upstream that cannot resume it from
// there (400) is asked for a new stream without one.
func TestHTTPUpstreamNotificationStreamResumes(t *testing.T) {
	t.Parallel()
	note := func(id, text string) string {
		return fmt.Sprintf("id: %s\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"data\":%q}}\n\n", id, text)
	}
	var (
		mu      sync.Mutex
		gets    []string // Last-Event-ID of each GET ("-" for none)
		ended   time.Time
		delays  []time.Duration
		release = make(chan struct{})
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		mu.Lock()
		last := "-"
		if v, ok := r.Header["Last-Event-Id"]; ok {
			last = v[0]
		}
		gets = append(gets, last)
		n := len(gets)
		if n > 1 {
			delays = append(delays, time.Since(ended))
		}
		mu.Unlock()
		if n == 3 && last != "-" {
			http.Error(w, "cannot replay", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		switch n {
		case 1:
			_, _ = io.WriteString(w, "id: g1\nretry: 150\ndata: \n\n"+note("g2", "first"))
		case 2:
			_, _ = io.WriteString(w, note("g3", "second"))
		default:
			_, _ = io.WriteString(w, note("h1", "third"))
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		mu.Lock()
		ended = time.Now()
		mu.Unlock()
	}))
	defer srv.Close()
	defer close(release)
	conn := dial(t, srv.URL)
	require.NoError(t, conn.Write(context.Background(), &jsonrpc.Request{Method: "notifications/initialized", Params: json.RawMessage(`{}`)}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var texts []string
	for len(texts) < 3 {
		msg, err := conn.Read(ctx)
		require.NoError(t, err)
		var p struct {
			Data string `json:"data"`
		}
		require.NoError(t, json.Unmarshal(msg.(*jsonrpc.Request).Params, &p))
		texts = append(texts, p.Data)
	}
	require.Equal(t, []string{"first", "second", "third"}, texts)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"-", "g2", "g3", "-"}, gets, "resumed from the newest id; a new stream after a refusal")
	require.GreaterOrEqual(t, delays[0], 150*time.Millisecond, "the reconnection waited the stream's retry")
}
