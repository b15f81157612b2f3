package mcpserver_test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"testing"

	gosdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/residual"
)

type bearerRT struct{ token string }

func (b bearerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestInteropOfficialSDK: the official go-sdk client, an independent implementation, lists
// the tools and runs begin → commit → replay, on both protocol eras, over streamable HTTP
// and over stdio (this test binary as the server process).
func TestInteropOfficialSDK(t *testing.T) {
	t.Parallel()
	httpTransport := func(t *testing.T) gosdk.Transport {
		return &gosdk.StreamableClientTransport{
			Endpoint: setup(t, nil).url, HTTPClient: &http.Client{Transport: bearerRT{tokA}}, DisableStandaloneSSE: true,
		}
	}
	stdioTransport := func(t *testing.T) gosdk.Transport {
		command, args, env := stdioServer(t, t.TempDir(), "default")
		cmd := exec.Command(command, args...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stderr = os.Stderr
		return &gosdk.CommandTransport{Command: cmd}
	}
	for _, tc := range []struct {
		name      string
		version   string
		transport func(*testing.T) gosdk.Transport
	}{
		{"http/" + legacy, legacy, httpTransport},
		{"http/" + modern, modern, httpTransport},
		{"stdio/" + legacy, legacy, stdioTransport},
		{"stdio/" + modern, modern, stdioTransport},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			version := tc.version
			cl := gosdk.NewClient(&gosdk.Implementation{Name: "go-sdk-interop", Version: "1"}, nil)
			sess, err := cl.Connect(ctx(t), tc.transport(t), &gosdk.ClientSessionOptions{ProtocolVersion: version})
			require.NoError(t, err)
			t.Cleanup(func() { sess.Close() })
			require.Equal(t, version, sess.InitializeResult().ProtocolVersion)

			tools, err := sess.ListTools(ctx(t), nil)
			require.NoError(t, err)
			var names []string
			for _, tl := range tools.Tools {
				names = append(names, tl.Name)
				require.NotNil(t, tl.InputSchema, tl.Name)
				require.NotNil(t, tl.OutputSchema, tl.Name)
			}
			require.ElementsMatch(t, []string{"list_pending", "inspect_residual", "begin_call", "commit_call", "renew_lease", "resolve_residual", "reconcile"}, names)

			call := func(name string, args map[string]any, out any) *gosdk.CallToolResult {
				t.Helper()
				res, err := sess.CallTool(ctx(t), &gosdk.CallToolParams{Name: name, Arguments: args})
				require.NoError(t, err)
				require.NotEmpty(t, res.Content)
				if out != nil {
					raw, err := json.Marshal(res.StructuredContent)
					require.NoError(t, err)
					require.NoError(t, json.Unmarshal(raw, out))
				}
				return res
			}
			args := map[string]any{"task": "sdk-run", "operation": "send_email", "target": "email:bob@example.com", "args": map[string]any{"subject": "hello"}}
			var b mcpserver.BeginResult
			require.False(t, call("begin_call", args, &b).IsError)
			require.Equal(t, mcpserver.DecisionProceed, b.Decision)

			var cm mcpserver.CommitResult
			require.False(t, call("commit_call", map[string]any{"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "outcome": "succeeded", "result": map[string]any{"message_id": "m-1"}}, &cm).IsError)
			require.Equal(t, residual.Succeeded, cm.State)

			var rp mcpserver.BeginResult
			res := call("begin_call", args, &rp)
			require.False(t, res.IsError)
			require.Equal(t, mcpserver.DecisionReplay, rp.Decision)
			require.JSONEq(t, `{"message_id":"m-1"}`, string(rp.Result))
			require.Contains(t, res.Content[0].(*gosdk.TextContent).Text, "REPLAY")

			// Tool errors reach this client as isError results too.
			res = call("commit_call", map[string]any{"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "outcome": "done"}, nil)
			require.True(t, res.IsError)
			require.Contains(t, res.Content[0].(*gosdk.TextContent).Text, `outcome "done"`)
		})
	}
}
