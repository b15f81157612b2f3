//lint:file-ignore SA1019 the fixture lists tools by the roots and sampling capabilities on purpose: hosts still declare them, deprecated since 2026-07-28 or not

package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// capsUpstreamEnv set makes the test binary the upstream of runCapsUpstream.
const capsUpstreamEnv = "TOOLFENCE_TEST_CAPS_UPSTREAM"

// runCapsUpstream serves over stdio, as server-everything does, tools listed only to a
// capable client: ask (elicitation), sample (sampling) and roots (roots, and only when its
// roots/list is answered), besides plain. It returns the exit status.
func runCapsUpstream() int {
	s := mcp.NewServer(&mcp.Implementation{Name: "caps-upstream", Version: "1"}, nil)
	for _, name := range []string{"plain", "ask", "sample", "roots"} {
		mcp.AddTool(s, &mcp.Tool{Name: name, Description: "Answer " + name + "."},
			func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + " done"}}}, nil, nil
			})
	}
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			list, ok := res.(*mcp.ListToolsResult)
			if err != nil || !ok {
				return res, err
			}
			ss := req.GetSession().(*mcp.ServerSession)
			caps := ss.InitializeParams().Capabilities
			_, rootsErr := ss.ListRoots(ctx, nil)
			list.Tools = slices.DeleteFunc(list.Tools, func(t *mcp.Tool) bool {
				switch t.Name {
				case "ask":
					return caps.Elicitation == nil
				case "sample":
					return caps.Sampling == nil
				case "roots":
					return rootsErr != nil
				}
				return false
			})
			return list, nil
		}
	})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		return 1
	}
	return 0
}

// TestProxyLockDeclaresClientCapabilities: lock and check declare sampling, elicitation
// and roots as hosts do, and answer the upstream's roots/list, so a tool listed only to
// capable hosts is pinned, checks ok and is served by the proxy with the pins;
// --capabilities= declares none.
func TestProxyLockDeclaresClientCapabilities(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	self, err := os.Executable()
	require.NoError(t, err)
	env := []string{capsUpstreamEnv + "=1"}
	pinsFile := filepath.Join(dir, "caps.pins.json")

	r := tf(t, env, "proxy", "lock", "--pins", pinsFile, "--server-id", "caps", "--capabilities=", "--", self)
	require.Equal(t, exitOK, r.code, r.String())
	require.Contains(t, r.stdout, "pinned 1 tool(s) of server caps", "without capabilities only plain is listed")
	r = tf(t, env, "proxy", "lock", "--pins", pinsFile, "--server-id", "caps", "--capabilities", "sampling,telepathy", "--", self)
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, `unknown capability "telepathy"`)

	r = tf(t, env, "proxy", "lock", "--pins", pinsFile, "--server-id", "caps", "--", self)
	require.Equal(t, exitOK, r.code, r.String())
	require.Contains(t, r.stdout, "pinned 4 tool(s) of server caps")
	var pins struct {
		Tools map[string]string `json:"tools"`
	}
	data, err := os.ReadFile(pinsFile)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &pins))
	require.Len(t, pins.Tools, 4)
	for _, name := range []string{"plain", "ask", "sample", "roots"} {
		require.Contains(t, pins.Tools, name)
	}

	r = tf(t, env, "proxy", "check", "--pins", pinsFile, "--server-id", "caps", "--", self)
	require.Equal(t, exitOK, r.code, r.String())
	require.Regexp(t, `(?m)^ask\s+protect\s+digest of arguments\s+ok\s`, r.stdout)

	// A host that declares elicitation, through the proxy with the pins: ask is served.
	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "decline"}, nil
		}})
	proxy := exec.Command(bin, "proxy", "--store", filepath.Join(dir, "proxy"), "--pins", pinsFile, "--server-id", "caps", "--", self)
	proxy.Env = append(os.Environ(), env...)
	s, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: proxy}, nil)
	require.NoError(t, err)
	defer s.Close()
	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{}})
	require.NoError(t, err)
	require.False(t, res.IsError, "%+v", res.Content)
	require.Equal(t, "ask done", res.Content[0].(*mcp.TextContent).Text)
}
