package interop_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/fixture/mcpfixture"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// confirming is a Go SDK client whose user accepts every elicitation of the upstream's
// (counted in asked) and answers toolfence's "Run it again?" with "Don't run it", in the
// revision version ("" for the SDK's latest, 2026-07-28).
func confirming(version string) (*mcp.Client, *mcp.ClientSessionOptions, *int) {
	asked := new(int)
	c := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-host", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			if strings.Contains(r.Params.Message, "Run it again?") {
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"answer": "Don't run it"}}, nil
			}
			*asked++
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, nil
		},
	})
	if version == "" {
		return c, nil, asked
	}
	return c, &mcp.ClientSessionOptions{ProtocolVersion: version}, asked
}

// revisionOf is the revision a session speaks: its InitializeResult's (for a stateless
// session, the one it negotiated by server/discover).
func revisionOf(s *mcp.ClientSession) string { return s.InitializeResult().ProtocolVersion }

// A host and an upstream of different revisions, through the proxy over stdio: a 2026-07-28
// host in front of a 2025-11-25-only upstream (the proxy opens a session upstream and puts
// the upstream's elicitation to the host as a round) and a 2025-11-25 host in front of a
// 2026-07-28-only upstream (the proxy answers initialize from server/discover and asks the
// host with elicitation/create when upstream answers input_required). Each lists the
// tools, makes a protected call (one effect, then a replay) and confirms a call that asks
// for input (one effect, one attempt).
func TestHostAndUpstreamOfDifferentRevisions(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, host, upstream string
		http                 bool // the host over HTTP (proxy --http), else over stdio
	}{
		{"2026-07-28 host, 2025-11-25-only upstream", "", "2025-11-25", false},
		{"2025-11-25 host, 2026-07-28-only upstream", "2025-11-25", "2026-07-28", false},
		{"2026-07-28 host over HTTP, 2025-11-25-only upstream", "", "2025-11-25", true},
		{"2025-11-25 host over HTTP, 2026-07-28-only upstream", "2025-11-25", "2026-07-28", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := setup(t, "gosdk", "")
			w.versions = c.upstream
			client, opts, asked := confirming(c.host)
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			var tr mcp.Transport = &mcp.CommandTransport{Command: w.cmd(w.proxyArgv(w.store))}
			if c.http {
				tr = &mcp.StreamableClientTransport{Endpoint: w.httpProxy(w.store), HTTPClient: &http.Client{Transport: bearer{tokenA}}}
			}
			s, err := client.Connect(ctx, tr, opts)
			require.NoError(t, err, "stderr:\n%s", w.stderr)
			if c.host == "" {
				require.Equal(t, "2026-07-28", revisionOf(s), "the host speaks its revision through the proxy")
			} else {
				require.Equal(t, c.host, revisionOf(s))
			}
			list, err := s.ListTools(ctx, nil)
			require.NoError(t, err)
			require.NotEmpty(t, list.Tools)
			first := (&goHost{s: s}).call(t, mcpfixture.ToolAppend, args, nil)
			require.False(t, first.IsError, first.Raw)
			again := (&goHost{s: s}).call(t, mcpfixture.ToolAppend, args, nil)
			require.True(t, again.Replayed, again.Raw)
			res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: mcpfixture.ToolConfirm, Arguments: args2})
			require.NoError(t, err)
			require.False(t, res.IsError, "%+v", res.Content)
			require.Equal(t, "appended "+args2["text"].(string)+" to "+args2["target"].(string), res.Content[0].(*mcp.TextContent).Text)
			require.Equal(t, 1, *asked, "the host's user confirmed once")
			require.NoError(t, s.Close())
			w.stopServing()
			require.Equal(t, 2, w.effectCount())
			ns := "default"
			if c.http {
				ns = "team-a" // tokenA's (httpProxy)
			}
			for _, r := range w.residualsIn(ns) {
				require.Equal(t, residual.Succeeded, r.State, r.Operation)
				require.Len(t, r.Attempts, 1, r.Operation)
			}
		})
	}
}

// A 2026-07-28 host and a 2025-11-25 host on one `proxy --http` at once, in front of an
// upstream that speaks both: each speaks its own revision, each makes its call once, and the
// second host's identical call meets the first's residual (one namespace). The calls name
// their task, so the identical call is the same work whatever ran in between (a call that
// names none is judged by the repeat rules: A, B, A sends the second A, repeat.go).
func TestTwoRevisionsOnOneHTTPProxy(t *testing.T) {
	t.Parallel()
	w := setup(t, "gosdk", "")
	url := w.httpProxy(w.store)
	connect := func(version string) *mcp.ClientSession {
		client, opts, _ := confirming(version)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		s, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{tokenA}}}, opts)
		require.NoError(t, err, "stderr:\n%s", w.stderr)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	stateless, session := connect(""), connect("2025-11-25")
	require.Equal(t, "2026-07-28", revisionOf(stateless))
	require.Equal(t, "2025-11-25", revisionOf(session))
	done := make(chan outcome, 2)
	task := func() map[string]any { return map[string]any{mcpwire.MetaTask: "two-revisions"} } // the SDK writes into _meta
	go func() { done <- (&goHost{s: stateless}).call(t, mcpfixture.ToolAppend, args, task()) }()
	go func() { done <- (&goHost{s: session}).call(t, mcpfixture.ToolAppend, args2, task()) }()
	for range 2 {
		o := <-done
		require.False(t, o.IsError, o.Raw)
	}
	again := (&goHost{s: session}).call(t, mcpfixture.ToolAppend, args, task())
	require.True(t, again.Replayed, "the session host's identical call meets the stateless host's residual: %s", again.Raw)
	require.Equal(t, 2, w.effectCount())
}
