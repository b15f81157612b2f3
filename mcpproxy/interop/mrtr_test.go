//lint:file-ignore SA1019 the sampling and roots rounds are what these tests bridge: hosts still declare them, deprecated since 2026-07-28 or not
package interop_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/fixture/mcpfixture"
	"github.com/toolfence/toolfence/residual"
)

// answering is a Go SDK client whose user answers every elicitation with a name and a color,
// every sampling request with "Paris" and every roots/list with one root.
func answering(version string) (*mcp.Client, *mcp.ClientSessionOptions) {
	c := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-host", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "Alice", "color": "green"}}, nil
		},
		CreateMessageHandler: func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			return &mcp.CreateMessageResult{Content: &mcp.TextContent{Text: "Paris"}, Model: "scripted", Role: "assistant"}, nil
		},
	})
	c.AddRoots(&mcp.Root{URI: "file:///srv", Name: "srv"})
	var opts *mcp.ClientSessionOptions
	if version != "" {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: version}
	}
	return c, opts
}

// Multi-round-trip calls through the proxy to the go-sdk's everything-server, a real MCP
// 2026-07-28 server whose tools ask for input: an elicitation round, a sampling round and a
// call of three rounds each complete as one call, recorded succeeded once with one attempt.
// Over stdio and over HTTP (a stateless host; the upstream a stdio child, and an HTTP
// upstream); and, for a 2025-11-25 host, the server asks the host itself (its requests are
// relayed), with the same outcome.
func TestMultiRoundCallsThroughTheProxy(t *testing.T) {
	t.Parallel()
	calls := []struct{ tool, want string }{
		{"test_input_required_result_elicitation", "Hello, Alice!"},
		{"test_input_required_result_sampling", "Sampling response: Paris"},
		{"test_input_required_result_multi_round", "Multi-round complete: Alice likes green"},
	}
	for _, c := range []struct {
		name    string
		version string // the host's; "" for the SDK's latest (2026-07-28)
		connect func(w *world) mcp.Transport
	}{
		{"stdio", "", func(w *world) mcp.Transport {
			argv := append(w.proxyArgv(w.store)[:len(w.proxyArgv(w.store))-2], everythingBin)
			return &mcp.CommandTransport{Command: w.cmd(argv)}
		}},
		{"stdio, 2025-11-25 host", "2025-11-25", func(w *world) mcp.Transport {
			argv := append(w.proxyArgv(w.store)[:len(w.proxyArgv(w.store))-2], everythingBin)
			return &mcp.CommandTransport{Command: w.cmd(argv)}
		}},
		{"http host, stdio upstream", "", func(w *world) mcp.Transport {
			return &mcp.StreamableClientTransport{Endpoint: w.everythingHTTPProxy(""), HTTPClient: &http.Client{Transport: bearer{tokenA}}}
		}},
		{"stdio host, http upstream", "", func(w *world) mcp.Transport {
			addr := freeAddr(w.t)
			up := w.startServing(exec.Command(everythingBin, "-http", addr), true, regexp.MustCompile(`listening at (\S+)`))
			return &mcp.CommandTransport{Command: w.cmd(w.upstreamProxyArgv(w.store, "http://"+up+"/mcp"))}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := setup(t, "gosdk", "")
			client, opts := answering(c.version)
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			s, err := client.Connect(ctx, c.connect(w), opts)
			require.NoError(t, err, "stderr:\n%s", w.stderr)
			made := 0
			for i, call := range calls {
				if c.version != "" && i == len(calls)-1 {
					// For a 2025-11-25 host the server asks once, itself, and then calls its tool
					// again once: a tool of several rounds cannot finish, directly or not.
					break
				}
				made++
				res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: call.tool, Arguments: map[string]any{}})
				require.NoError(t, err, call.tool)
				require.False(t, res.IsError, "%s: %+v", call.tool, res.Content)
				require.Equal(t, call.want, res.Content[0].(*mcp.TextContent).Text)
			}
			require.NoError(t, s.Close())
			w.stopServing()
			rs := w.residuals()
			require.Len(t, rs, made, "one residual per call")
			for _, r := range rs {
				require.Equal(t, residual.Succeeded, r.State, r.Operation)
				require.Len(t, r.Attempts, 1, "%s: rounds of one attempt", r.Operation)
			}
		})
	}
}

// A proxy SIGKILLed between two rounds of a protected call leaves its attempt pending: the
// host's continuation, through a successor proxy on the same store, is refused (in progress,
// then unknown once the lease expired), never dispatched a second time; the tool never ran.
func TestProxyKilledBetweenRounds(t *testing.T) {
	t.Parallel()
	w := setup(t, "gosdk", "")
	w.flags = []string{"--lease", "2s"}
	first := w.cmd(w.proxyArgv(w.store))
	client := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-host", Version: "1"}, &mcp.ClientOptions{
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	s, err := client.Connect(ctx, &mcp.CommandTransport{Command: first}, nil)
	require.NoError(t, err, "stderr:\n%s", w.stderr)
	round, err := s.CallTool(ctx, &mcp.CallToolParams{Name: mcpfixture.ToolConfirm, Arguments: args})
	require.NoError(t, err)
	require.True(t, round.NeedsInput(), "upstream asks to confirm")
	state := round.RequestState
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = s.Close()

	s2, err := client.Connect(ctx, &mcp.CommandTransport{Command: w.cmd(w.proxyArgv(w.store))}, nil)
	require.NoError(t, err)
	defer s2.Close()
	continuation := &mcp.CallToolParams{Name: mcpfixture.ToolConfirm, Arguments: args, RequestState: state,
		InputResponses: mcp.InputResponseMap{"ok": &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := s2.CallTool(ctx, continuation)
		require.NoError(t, err)
		o := outcomeOf(t, res)
		require.True(t, o.IsError, "the continuation is refused, not dispatched: %s", o.Raw)
		if o.Kind == kindUnknown {
			require.Contains(t, o.text(), "do not retry")
			break
		}
		require.Equal(t, kindInProgress, o.Kind, o.Raw)
		require.True(t, time.Now().Before(deadline), "still in progress: %s", o.Raw)
		time.Sleep(100 * time.Millisecond) // the dead proxy's lease expires in its own time
	}
	require.Zero(t, w.dispatchCount(), "the tool never ran")
	require.Zero(t, w.effectCount())
}

// cmd is argv as a command with the world's environment, its stderr the world's.
func (w *world) cmd(argv []string) *exec.Cmd {
	c := exec.Command(argv[0], argv[1:]...)
	c.Env, c.Stderr = w.env(), w.stderr
	return c
}

// outcomeOf is a Go SDK CallToolResult as an outcome.
func outcomeOf(t *testing.T, res *mcp.CallToolResult) outcome {
	t.Helper()
	b, err := json.Marshal(res)
	require.NoError(t, err)
	return parseOutcome(t, b)
}

// everythingHTTPProxy serves the everything-server (a stdio child) through
// `toolfence proxy --http` with tokenA and returns its MCP URL.
func (w *world) everythingHTTPProxy(string) string {
	w.t.Helper()
	tokens := filepath.Join(w.dir, "tokens")
	require.NoError(w.t, os.WriteFile(tokens, []byte(tokenA+" default\n"), 0o600))
	argv := []string{bin, "proxy", "--store", w.store, "--server-id", "fx", "--http", "127.0.0.1:0", "--token-file", tokens, "--", everythingBin}
	return w.startServing(exec.Command(argv[0], argv[1:]...), true, regexp.MustCompile(`serving MCP at (http://\S+)`))
}

// freeAddr is a loopback address with a port free a moment ago (for a server that cannot
// say which port it took).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}
