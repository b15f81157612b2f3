//lint:file-ignore SA1019 these tests cover the legacy protocol paths (logging, GET streams, subscribe) on purpose

package mcpserver_test

import (
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
)

// send sends one MCP request with token and the header pairs (name, value, …) and returns
// the status, headers and body of the answer.
func send(t *testing.T, method, url, token, body string, header ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// initialize opens a legacy session with token and returns its ID.
func initialize(t *testing.T, url, token string) string {
	t.Helper()
	status, h, body := send(t, http.MethodPost, url, token, initBody)
	require.Equal(t, http.StatusOK, status, body)
	id := h.Get("Mcp-Session-Id")
	require.NotEmpty(t, id)
	return id
}

// ping sends a ping in session id and returns the HTTP status.
func ping(t *testing.T, url, token, id string) int {
	t.Helper()
	status, _, _ := send(t, http.MethodPost, url, token, `{"jsonrpc":"2.0","id":2,"method":"ping"}`,
		"Mcp-Session-Id", id, "Mcp-Protocol-Version", legacy)
	return status
}

// TestSessionsCappedPerToken: initializes never followed by DELETE hold at most MaxSessions
// sessions per token; the least recently used one ends first, and another token's
// sessions are untouched (and not usable with the first token).
func TestSessionsCappedPerToken(t *testing.T) {
	t.Parallel()
	const max, n = 8, 200
	e := setup(t, func(o *mcpserver.Options) { o.MaxSessions = max })
	b := initialize(t, e.url, tokB)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = initialize(t, e.url, tokA)
		e.clock.Advance(time.Millisecond) // a distinct last use for each
	}
	require.LessOrEqual(t, e.srv.Sessions(), max+1, "sessions of A, plus B's one")
	require.Equal(t, http.StatusNotFound, ping(t, e.url, tokA, ids[0]), "the oldest session was ended")
	require.Equal(t, http.StatusOK, ping(t, e.url, tokA, ids[n-1]), "the newest lives")
	require.Equal(t, http.StatusOK, ping(t, e.url, tokB, b), "another token's session is untouched")
	require.Equal(t, http.StatusNotFound, ping(t, e.url, tokA, b), "a session belongs to its token")
}

// TestIdleSessionsSwept: sessions without requests for SessionIdle end (their clients get
// 404 and initialize anew); a session with an open notification stream does not.
func TestIdleSessionsSwept(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *mcpserver.Options) { o.SessionIdle = time.Minute })
	ids := make([]string, 20)
	for i := range ids {
		ids[i] = initialize(t, e.url, tokA)
	}
	// A client with a notification stream open (GET) is busy, not idle.
	sub := e.dial(tokA, legacy, transport.WithContinuousListening())
	n := collect(sub)
	ok[mcpserver.BeginResult](t, e.dial(tokA, modern), mcpserver.ToolBegin, map[string]any{
		"task": "t", "operation": "op", "target": "x", "args": map[string]any{},
	})
	n.await(t, "notifications/resources/list_changed", "") // so its stream is open
	require.Equal(t, 21, e.srv.Sessions())
	e.clock.BlockUntil(1)
	e.clock.Advance(2 * time.Minute)
	deadline := time.Now().Add(10 * time.Second)
	for e.srv.Sessions() > 1 && time.Now().Before(deadline) {
		e.clock.BlockUntil(1)
		e.clock.Advance(30 * time.Second)
		runtime.Gosched()
	}
	require.LessOrEqual(t, e.srv.Sessions(), 1, "idle sessions were swept")
	for _, id := range ids {
		require.Equal(t, http.StatusNotFound, ping(t, e.url, tokA, id))
	}
	res, err := sub.ListTools(ctx(t), mcp.ListToolsRequest{})
	require.NoError(t, err, "the client of a live session keeps working")
	require.NotEmpty(t, res.Tools)
}

// TestSessionMemoryBounded measures the heap held by initializes never followed by DELETE,
// with the per-token cap and (for comparison, as before it existed) without; it logs the
// figures docs/limits.md quotes.
func TestSessionMemoryBounded(t *testing.T) {
	const n = 2000
	held := func(maxSessions int) (int64, int) {
		e := setup(t, func(o *mcpserver.Options) { o.MaxSessions = maxSessions })
		heap := func() uint64 {
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return m.HeapAlloc
		}
		initialize(t, e.url, tokA)
		before := heap()
		for range n {
			initialize(t, e.url, tokA)
		}
		return int64(heap()) - int64(before), e.srv.Sessions()
	}
	uncapped, open := held(1 << 30)
	t.Logf("%d initializes without DELETE, no cap: %d sessions open, heap %+d KiB (%d B each)", n, open, uncapped>>10, uncapped/n)
	capped, open := held(0)
	t.Logf("%d initializes without DELETE, default cap %d: %d sessions open, heap %+d KiB", n, mcpwire.DefaultMaxSessions, open, capped>>10)
	require.LessOrEqual(t, open, mcpwire.DefaultMaxSessions)
	require.Less(t, capped, uncapped/4, "sessions past the cap are reclaimed")
}

// TestStreamNeedsLiveSession: a GET (notification stream) without a session ID, with an
// unknown one or with another token's, gets 404 instead of opening an untracked session.
func TestStreamNeedsLiveSession(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	b := initialize(t, e.url, tokB)
	for name, id := range map[string]string{"none": "", "unknown": "tf-session-00000000000000000000000000000000", "other token's": b} {
		hdr := []string{"Accept", "text/event-stream", "Mcp-Protocol-Version", legacy}
		if id != "" {
			hdr = append(hdr, "Mcp-Session-Id", id)
		}
		status, _, _ := send(t, http.MethodGet, e.url, tokA, "", hdr...)
		require.Equal(t, http.StatusNotFound, status, name)
	}
	require.Equal(t, 1, e.srv.Sessions(), "no session was opened by a GET")
}

// TestSessionCapHoldsWhateverTheHeaders: an initialize opens a session even when it carries
// an Mcp-Session-Id (mcp-go ignores it), so a made-up header must not skip the cap; and
// initializes sent at once cannot overshoot it either.
func TestSessionCapHoldsWhateverTheHeaders(t *testing.T) {
	t.Parallel()
	const max = 8
	e := setup(t, func(o *mcpserver.Options) { o.MaxSessions = max })
	for range 40 {
		status, _, body := send(t, http.MethodPost, e.url, tokA, initBody, "Mcp-Session-Id", "made-up")
		require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, status, body)
	}
	require.LessOrEqual(t, e.srv.Sessions(), max, "initializes with a made-up session ID")
	var wg sync.WaitGroup
	for range 12 {
		wg.Go(func() { send(t, http.MethodPost, e.url, tokA, initBody) })
	}
	wg.Wait()
	require.LessOrEqual(t, e.srv.Sessions(), max, "initializes at once")
}
