//lint:file-ignore SA1019 these tests cover the legacy protocol paths (logging, GET streams, subscribe) on purpose

package mcpproxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpproxy/transport"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// httpUpstream is an MCP server of the official Go SDK behind its streamable HTTP handler,
// with the append tool of the stdio fixture. Its mode file also makes the HTTP layer
// misbehave on tools/call after the tool ran: "502" answers 502, "drop" closes the
// connection without an answer, "garbage" answers 200 with a body that is not JSON-RPC.
// "hang" writes the effect, sends a progress notification, then waits for cancellation.
type httpUpstream struct {
	srv  *httptest.Server
	mu   sync.Mutex
	keys []string // X-Api-Key of every request
}

func (u *httpUpstream) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.keys...)
}

func newHTTPUpstream(t *testing.T, effects, modeFile string) *httpUpstream {
	t.Helper()
	u := &httpUpstream{}
	u.srv = httptest.NewServer(u.handler(effects, modeFile))
	t.Cleanup(u.srv.Close)
	return u
}

// handler is the fixture's HTTP handler (see httpUpstream).
func (u *httpUpstream) handler(effects, modeFile string) http.Handler {
	s := mcp.NewServer(&mcp.Implementation{Name: "http-fixture", Version: "1.0.0"}, nil)
	mode := func() string { m, _ := os.ReadFile(modeFile); return strings.TrimSpace(string(m)) }
	textOf := func(s string) []mcp.Content { return []mcp.Content{&mcp.TextContent{Text: s}} }
	mcp.AddTool(s, &mcp.Tool{Name: "append", Description: "Append a line to the effects file."},
		func(ctx context.Context, req *mcp.CallToolRequest, in appendIn) (*mcp.CallToolResult, any, error) {
			f, err := os.OpenFile(effects, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
			if err != nil {
				return nil, nil, err
			}
			_, err = fmt.Fprintf(f, "append|%s|%s\n", in.Target, in.Text)
			if err == nil {
				err = f.Sync()
			}
			f.Close()
			if err != nil {
				return nil, nil, err
			}
			if tok := req.Params.GetProgressToken(); tok != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Total: 1, Message: "effect written"})
			}
			if mode() == "hang" {
				<-ctx.Done()
				return nil, nil, ctx.Err()
			}
			return &mcp.CallToolResult{Content: textOf("appended " + in.Text + " to " + in.Target)}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "read", Description: "Read the effects file.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			b, _ := os.ReadFile(effects)
			return &mcp.CallToolResult{Content: textOf(fmt.Sprintf("%d lines", strings.Count(string(b), "\n")))}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "notify", Description: "Log a line and add a tool (list_changed).", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: "log from upstream"})
			mcp.AddTool(s, &mcp.Tool{Name: "extra", Description: "Added at run time."},
				func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
					return &mcp.CallToolResult{Content: textOf("extra")}, nil, nil
				})
			return &mcp.CallToolResult{Content: textOf("notified")}, nil, nil
		})
	inner := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.keys = append(u.keys, r.Header.Get("X-Api-Key"))
		u.mu.Unlock()
		if r.Method != http.MethodPost {
			inner.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		m := mode()
		if !strings.Contains(string(body), `"tools/call"`) || (m != "502" && m != "drop" && m != "garbage") {
			inner.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, r) // the tool runs: the effect happens
		switch m {
		case "502":
			http.Error(w, "bad gateway", http.StatusBadGateway)
		case "garbage":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, "<html>this is not JSON-RPC</html>")
		case "drop":
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}
	})
}

// The test binary is also an HTTP upstream process (TOOLFENCE_TEST_ROLE=httpupstream): it
// serves the fixture's handler on a loopback port it prints on stdout, until it is killed.
// Chosen in init, before TestMain.
func init() {
	if os.Getenv("TOOLFENCE_TEST_ROLE") != "httpupstream" {
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "httpupstream:", err)
		os.Exit(1)
	}
	fmt.Printf("http://%s/mcp\n", ln.Addr())
	_ = http.Serve(ln, (&httpUpstream{}).handler(os.Getenv("TF_EFFECTS"), os.Getenv("TF_MODE")))
	os.Exit(1)
}

// TestHTTPUpstreamProcessKilledMidCall: an HTTP upstream process SIGKILLed after the
// effect and before its answer gives an unknown outcome; the next call, with the upstream
// back, is refused and nothing runs twice.
func TestHTTPUpstreamProcessKilledMidCall(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	start := func() (*exec.Cmd, string) {
		cmd := commandWithEnv(os.Args[0], "TOOLFENCE_TEST_ROLE=httpupstream", "TF_EFFECTS="+w.effects, "TF_MODE="+w.mode)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		line, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		return cmd, strings.TrimSpace(line)
	}
	proc, url := start()
	conn, err := transport.DialUpstream(context.Background(), url, nil)
	require.NoError(t, err)
	progress := make(chan struct{}, 1)
	s := w.host(conn, &mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
		progress <- struct{}{}
	}})
	w.setMode("hang")
	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "append", Arguments: args, Meta: mcp.Meta{"progressToken": "k"}})
		if err != nil {
			res = &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
		}
		done <- res
	}()
	select {
	case <-progress: // the effect is on disk
	case <-time.After(30 * time.Second):
		t.Fatal("no progress from the upstream")
	}
	require.NoError(t, proc.Process.Kill())
	first := <-done
	require.True(t, first.IsError, text(first))
	require.Equal(t, string(interceptor.UnknownOutcome), errorKind(t, first), text(first))
	require.Equal(t, 1, w.effectCount())

	// The upstream process is gone for good, so is its session; a new proxy session with a
	// new upstream process still refuses the key.
	w.setMode("ok")
	_, url = start()
	conn, err = transport.DialUpstream(context.Background(), url, nil)
	require.NoError(t, err)
	s = w.host(conn, nil)
	second := call(t, s, "append", args, nil)
	require.True(t, second.IsError, text(second))
	require.Equal(t, string(interceptor.UnknownOutcome), errorKind(t, second))
	require.Equal(t, 1, w.effectCount(), "no second dispatch")
}

// TestHTTPUpstreamSameCallTwiceIsOneEffectAndHeadersReachIt: through an HTTP upstream, the
// same protected call twice is one effect and a replay; the upstream's progress
// notification reaches the host; every request upstream carries the --header value.
func TestHTTPUpstreamSameCallTwiceIsOneEffectAndHeadersReachIt(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	up := newHTTPUpstream(t, w.effects, w.mode)
	hdr, err := transport.ParseHeaders([]string{"X-Api-Key=sk-secret-123"})
	require.NoError(t, err)
	conn, err := transport.DialUpstream(context.Background(), up.srv.URL, hdr)
	require.NoError(t, err)
	progress := make(chan string, 4)
	s := w.host(conn, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
		progress <- r.Params.Message
	}})

	args := map[string]any{"target": "inbox:bob", "text": "hello"}
	first := call(t, s, "append", args, mcp.Meta{"progressToken": "p1"})
	require.False(t, first.IsError, text(first))
	require.Equal(t, "appended hello to inbox:bob", text(first))
	select {
	case m := <-progress:
		require.Equal(t, "effect written", m)
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream's progress notification did not reach the host")
	}
	second := call(t, s, "append", args, nil)
	require.Equal(t, true, second.Meta[mcpwire.MetaReplayed], text(second))
	require.Equal(t, 1, w.effectCount())
	res := call(t, s, "read", nil, nil)
	require.Equal(t, "1 lines", text(res), "a read-only tool is forwarded")

	keys := up.seen()
	require.NotEmpty(t, keys)
	for _, k := range keys {
		require.Equal(t, "sk-secret-123", k, "every request upstream carries the header")
	}
}

// TestHTTPUpstreamFailureMidCallIsUnknown: an upstream that answers 502, drops the
// connection or answers garbage after the effect gives an unknown outcome; the next call is
// refused without a second dispatch, and the proxy keeps serving.
func TestHTTPUpstreamFailureMidCallIsUnknown(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"502", "drop", "garbage"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, "")
			up := newHTTPUpstream(t, w.effects, w.mode)
			conn, err := transport.DialUpstream(context.Background(), up.srv.URL, nil)
			require.NoError(t, err)
			s := w.host(conn, nil)
			require.False(t, call(t, s, "read", nil, nil).IsError, "the session works")
			w.setMode(mode)
			args := map[string]any{"target": "inbox:bob", "text": "hello"}
			first := call(t, s, "append", args, nil)
			require.True(t, first.IsError, text(first))
			require.Equal(t, string(interceptor.UnknownOutcome), errorKind(t, first), text(first))
			require.Equal(t, 1, w.effectCount())

			w.setMode("ok")
			second := call(t, s, "append", args, nil)
			require.True(t, second.IsError, text(second))
			require.Equal(t, string(interceptor.UnknownOutcome), errorKind(t, second))
			require.Equal(t, 1, w.effectCount(), "no second dispatch")
			rs := w.residuals("default")
			require.Len(t, rs, 1)
			require.Equal(t, residual.Unknown, rs[0].State)
			require.Equal(t, "1 lines", text(call(t, s, "read", nil, nil)), "the proxy still serves")
		})
	}
}
