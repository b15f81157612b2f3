package interop_test

import (
	"bufio"
	"context"
	"net/http"
	"os/exec"
	"regexp"
	"syscall"
	"testing"
	"time"

	mcpgoclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// startServing starts cmd, waits for the line of out (its stdout or stderr) that re matches,
// and returns re's first group (an URL). The process is killed and reaped at the end of the
// test.
func (w *world) startServing(cmd *exec.Cmd, fromStderr bool, re *regexp.Regexp) string {
	w.t.Helper()
	cmd.Env = w.env()
	var pipe func() (interface{ Read([]byte) (int, error) }, error)
	if fromStderr {
		p, err := cmd.StderrPipe()
		require.NoError(w.t, err)
		cmd.Stdout = w.stderr
		pipe = func() (interface{ Read([]byte) (int, error) }, error) { return p, nil }
	} else {
		p, err := cmd.StdoutPipe()
		require.NoError(w.t, err)
		cmd.Stderr = w.stderr
		pipe = func() (interface{ Read([]byte) (int, error) }, error) { return p, nil }
	}
	r, _ := pipe()
	require.NoError(w.t, cmd.Start())
	w.served = append(w.served, cmd)
	w.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			_, _ = w.stderr.Write([]byte(line + "\n"))
			if m := re.FindStringSubmatch(line); m != nil && !sent {
				sent = true
				found <- m[1]
			}
		}
		close(found)
	}()
	select {
	case u, ok := <-found:
		require.True(w.t, ok, "%s ended without serving; stderr:\n%s", cmd.Path, w.stderr)
		return u
	case <-time.After(30 * time.Second):
		w.t.Fatalf("%s did not say where it serves; stderr:\n%s", cmd.Path, w.stderr)
		return ""
	}
}

// stopServing ends what startServing started (SIGTERM, then waits), so the store is free.
func (w *world) stopServing() {
	for _, c := range w.served {
		_ = c.Process.Signal(syscall.SIGTERM)
		_ = c.Wait()
	}
	w.served = nil
}

// httpFixture serves the world's fixture over streamable HTTP and returns its MCP URL.
func (w *world) httpFixture() string {
	w.t.Helper()
	return w.startServing(exec.Command(fxBin, w.fixture, "127.0.0.1:0"), false,
		regexp.MustCompile(`^mcpfixture: serving (http://\S+)$`))
}

// bearer is an http.RoundTripper that adds "Authorization: Bearer token".
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.token != "" {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// goSDKHTTP connects an official Go SDK client over streamable HTTP to url.
func (w *world) goSDKHTTP(url, token string) *goHost {
	w.t.Helper()
	h := &goHost{progress: make(chan *mcp.ProgressNotificationParams, 16)}
	c := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-host", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) { h.progress <- r.Params },
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{token}}}, nil)
	require.NoError(w.t, err, "stderr:\n%s", w.stderr)
	h.s = s
	w.t.Cleanup(func() { _ = s.Close() })
	return h
}

// mcpGoHTTP connects an mcp-go client over streamable HTTP to url, asking for protocol
// version (mcpgo.LATEST_PROTOCOL_VERSION, what an mcp-go host asks for, when "").
func (w *world) mcpGoHTTP(url, token, version string) *mcpGoHost {
	w.t.Helper()
	var opts []transport.StreamableHTTPCOption
	if token != "" {
		opts = append(opts, transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	}
	c, err := mcpgoclient.NewStreamableHttpClient(url, opts...)
	require.NoError(w.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(w.t, c.Start(ctx))
	w.t.Cleanup(func() { _ = c.Close() })
	if version == "" {
		version = mcpgo.LATEST_PROTOCOL_VERSION
	}
	_, err = c.Initialize(ctx, mcpgo.InitializeRequest{Params: mcpgo.InitializeParams{
		ProtocolVersion: version, ClientInfo: mcpgo.Implementation{Name: "mcp-go-host", Version: "1"}}})
	require.NoError(w.t, err, "stderr:\n%s", w.stderr)
	return &mcpGoHost{c: c}
}

// TestHTTPFixturesServe is a check of the harness itself: both fixtures answer both HTTP
// hosts as they answer over stdio.
func TestHTTPFixturesServe(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, "")
			url := w.httpFixture()
			// mcp-go v1.2.1's client asking for its latest version (2026-07-28) fails its first
			// request to a Go SDK v1.8.0 HTTP server ("unsupported protocol version"); through
			// the proxy's --http it does not (TestHTTPHostsSeeUpstreamToolsAndReplays).
			version := ""
			if fx == "gosdk" {
				version = mcpgo.ProtocolVersion20251125
			}
			for name, h := range map[string]host{"gosdk": w.goSDKHTTP(url, ""), "mcpgo": w.mcpGoHTTP(url, "", version)} {
				stdio := hostKinds[name](w, w.directArgv())
				require.JSONEq(t, string(stdio.tools(t)), string(h.tools(t)), name)
				require.NoError(t, stdio.close())
				o := h.call(t, "append", map[string]any{"target": name, "text": "x"}, nil)
				require.Equal(t, []string{"appended x to " + name}, o.Texts)
			}
			require.Equal(t, 2, w.effectCount())
		})
	}
}
