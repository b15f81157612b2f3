package mcpserver_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

type m = map[string]any

// TestToolsOverTransports runs every tool, resource and the prompt over each transport:
// a stdio server process (both protocol eras), and streamable HTTP with sessions
// (2025-11-25), stateless (2026-07-28), and a server without sessions.
func TestToolsOverTransports(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		dial   func(t *testing.T) *client.Client
		probes bool
	}{
		{"stdio/2025-11-25", func(t *testing.T) *client.Client { return dialStdio(t, t.TempDir(), "default", legacy) }, false},
		{"stdio/2026-07-28", func(t *testing.T) *client.Client { return dialStdio(t, t.TempDir(), "default", modern) }, false},
		{"http-session/2025-11-25", func(t *testing.T) *client.Client {
			c := setup(t, nil).dial(tokA, legacy)
			require.NotEmpty(t, c.GetSessionId(), "the legacy era gets a session")
			return c
		}, true},
		{"http/2026-07-28", func(t *testing.T) *client.Client {
			c := setup(t, nil).dial(tokA, modern)
			require.Empty(t, c.GetSessionId(), "the stateless era has no session")
			return c
		}, true},
		{"http-stateless-server/2025-11-25", func(t *testing.T) *client.Client {
			c := setup(t, func(o *mcpserver.Options) { o.HTTPStateless = true }).dial(tokA, legacy)
			require.Empty(t, c.GetSessionId(), "a stateless server mints no session")
			return c
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			exercise(t, tc.dial(t), tc.probes)
		})
	}
}

func exercise(t *testing.T, c *client.Client, probes bool) {
	const task = "run-42"
	tools, err := c.ListTools(ctx(t), mcp.ListToolsRequest{})
	require.NoError(t, err)
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	require.ElementsMatch(t, []string{"list_pending", "inspect_residual", "begin_call", "commit_call", "renew_lease", "resolve_residual", "reconcile"}, names)

	list := ok[mcpserver.ListResult](t, c, "list_pending", m{})
	require.Empty(t, list.Residuals)

	// begin → proceed; a second begin is blocked while the lease is live.
	b := ok[mcpserver.BeginResult](t, c, "begin_call", m{
		"task": task, "operation": "charge", "target": "invoice:1",
		"args": m{"amount": 5, "currency": "EUR"}, "holder": "agent-a", "lease_ms": 60000,
	})
	require.Equal(t, mcpserver.DecisionProceed, b.Decision)
	require.NoError(t, residual.ValidKey(b.Key))
	require.Positive(t, b.Token)
	require.Equal(t, 1, b.Attempt)
	require.Regexp(t, `^[0-9a-f]{32}$`, b.LeaseSecret)
	require.Equal(t, "agent-a#"+holderHash(b.LeaseSecret), b.Holder, "the holder carries the hash of the lease secret")
	require.EqualValues(t, 60000, b.LeaseMS)
	require.False(t, b.LeaseExpiresAt.IsZero())

	list = ok[mcpserver.ListResult](t, c, "list_pending", m{"task": task})
	require.Len(t, list.Residuals, 1)
	require.Equal(t, residual.Pending, list.Residuals[0].State)
	require.Equal(t, b.Holder, list.Residuals[0].Holder)
	require.Equal(t, b.Key, list.Residuals[0].Key)
	require.Contains(t, list.Residuals[0].Recovery, "do not act on it")

	again := ok[mcpserver.BeginResult](t, c, "begin_call", m{
		"task": task, "operation": "charge", "target": "invoice:1", "args": m{"amount": 5, "currency": "EUR"},
	})
	require.Equal(t, mcpserver.DecisionBlocked, again.Decision)
	require.Equal(t, interceptor.Kind("in_progress"), again.Violation.Kind)
	require.Positive(t, again.Violation.RetryAfterMS)
	require.Equal(t, b.Holder, again.Violation.Holder)
	require.Empty(t, again.LeaseSecret)

	rn := ok[mcpserver.RenewResult](t, c, "renew_lease", m{"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "lease_ms": 120000})
	require.True(t, rn.LeaseExpiresAt.After(b.LeaseExpiresAt), "renewed lease ends later")

	cm := ok[mcpserver.CommitResult](t, c, "commit_call", m{
		"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "outcome": "succeeded", "result": m{"charge": "ch_1"}, "upstream_status": 200,
	})
	require.Equal(t, residual.Succeeded, cm.State)
	require.Equal(t, 1, cm.Attempt)

	// Semantically equal args (other key order, 5.0) replay the cached result.
	rp := ok[mcpserver.BeginResult](t, c, "begin_call", m{
		"task": task, "operation": "charge", "target": "invoice:1", "args": json.RawMessage(`{"currency":"EUR","amount":5.0}`),
	})
	require.Equal(t, mcpserver.DecisionReplay, rp.Decision)
	require.JSONEq(t, `{"charge":"ch_1"}`, string(rp.Result))
	require.Equal(t, b.Key, rp.Key)

	mm := ok[mcpserver.BeginResult](t, c, "begin_call", m{
		"task": task, "operation": "charge", "target": "invoice:1", "args": m{"amount": 6, "currency": "EUR"},
	})
	require.Equal(t, mcpserver.DecisionBlocked, mm.Decision)
	require.Equal(t, interceptor.Kind("payload_mismatch"), mm.Violation.Kind)
	require.JSONEq(t, `{"charge":"ch_1"}`, string(mm.Violation.Result))

	v := ok[mcpserver.ResidualView](t, c, "inspect_residual", m{"key": b.Key})
	require.Equal(t, residual.Succeeded, v.State)
	require.Len(t, v.Attempts, 1)
	require.Equal(t, b.Holder, v.Attempts[0].Holder)
	require.JSONEq(t, `{"charge":"ch_1"}`, string(v.Result))
	require.NotEmpty(t, v.ResultDigest)

	// An ambiguous outcome blocks until reconciled.
	op := "email"
	if probes {
		op = opProbed
	}
	u := ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": task, "operation": op, "target": "bob@example.com", "args": m{"subject": "hi"}})
	require.Equal(t, mcpserver.DecisionProceed, u.Decision)
	ucm := ok[mcpserver.CommitResult](t, c, "commit_call", m{"key": u.Key, "token": u.Token, "lease_secret": u.LeaseSecret, "outcome": "unknown", "error": "timeout after 30s"})
	require.Equal(t, residual.Unknown, ucm.State)
	ub := ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": task, "operation": op, "target": "bob@example.com", "args": m{"subject": "hi"}})
	require.Equal(t, mcpserver.DecisionBlocked, ub.Decision)
	require.Equal(t, interceptor.Kind("unknown_outcome"), ub.Violation.Kind)
	require.Contains(t, ub.Violation.Recovery, "reconcile")
	list = ok[mcpserver.ListResult](t, c, "list_pending", m{"state": "unknown"})
	require.Len(t, list.Residuals, 1)
	require.Equal(t, u.Key, list.Residuals[0].Key)

	rec := ok[mcpserver.ReconcileResult](t, c, "reconcile", m{"key": u.Key})
	if probes {
		require.Len(t, rec.Settled, 1)
		require.Empty(t, rec.Unsettled)
		require.Equal(t, residual.Succeeded, rec.Settled[0].To)
		require.Greater(t, rec.Settled[0].Token, u.Token)
	} else {
		require.Empty(t, rec.Settled)
		require.Len(t, rec.Unsettled, 1)
		require.Contains(t, rec.Unsettled[0].Reason, "no probe")
		rs := ok[mcpserver.ResolveResult](t, c, "resolve_residual", m{
			"key": u.Key, "as": "succeeded", "note": "found the email in the sent folder", "result": m{"found": "bob@example.com"},
		})
		require.Equal(t, residual.Unknown, rs.From)
		require.Equal(t, residual.Succeeded, rs.State)
		require.Greater(t, rs.Token, u.Token)
	}
	ur := ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": task, "operation": op, "target": "bob@example.com", "args": m{"subject": "hi"}})
	require.Equal(t, mcpserver.DecisionReplay, ur.Decision)
	require.JSONEq(t, `{"found":"bob@example.com"}`, string(ur.Result))

	// A queued answer is never a success: refused, then committed as accepted.
	a := ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": task, "operation": "export", "target": "report:9", "args": m{}})
	require.Equal(t, mcpserver.DecisionProceed, a.Decision)
	e := fails(t, c, "commit_call", m{"key": a.Key, "token": a.Token, "lease_secret": a.LeaseSecret, "outcome": "succeeded", "upstream_status": 202, "handle": "/jobs/9"})
	require.Equal(t, mcpwire.KindRefused, e.Kind)
	require.Contains(t, e.Recovery, "accepted")
	acm := ok[mcpserver.CommitResult](t, c, "commit_call", m{"key": a.Key, "token": a.Token, "lease_secret": a.LeaseSecret, "outcome": "accepted", "upstream_status": 202, "handle": "/jobs/9"})
	require.Equal(t, residual.Accepted, acm.State)
	ab := ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": task, "operation": "export", "target": "report:9", "args": m{}})
	require.Equal(t, interceptor.Kind("awaiting_upstream"), ab.Violation.Kind)
	require.Equal(t, "/jobs/9", ab.Violation.Handle)
	rs := ok[mcpserver.ResolveResult](t, c, "resolve_residual", m{"key": a.Key, "as": "failed", "note": "job 9 was cancelled upstream"})
	require.Equal(t, residual.Accepted, rs.From)
	require.Equal(t, residual.Failed, rs.State)
	a2 := ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": task, "operation": "export", "target": "report:9", "args": m{}})
	require.Equal(t, mcpserver.DecisionProceed, a2.Decision)
	require.Equal(t, 2, a2.Attempt, "a failed residual takes a new attempt")
	require.Greater(t, a2.Token, rs.Token)
	require.Equal(t, residual.Failed, ok[mcpserver.CommitResult](t, c, "commit_call", m{
		"key": a2.Key, "token": a2.Token, "lease_secret": a2.LeaseSecret, "outcome": "failed", "upstream_status": 422,
	}).State)

	// Resources and the prompt.
	// Leave one residual open for the resources.
	open := ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": task, "operation": "deploy", "target": "svc:api", "args": m{"v": 2}})
	rr, err := c.ReadResource(ctx(t), mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: mcpserver.PendingURI}})
	require.NoError(t, err)
	var pending mcpserver.ListResult
	require.NoError(t, json.Unmarshal([]byte(rr.Contents[0].(mcp.TextResourceContents).Text), &pending))
	require.Len(t, pending.Residuals, 1)
	require.Equal(t, open.Key, pending.Residuals[0].Key)
	rr, err = c.ReadResource(ctx(t), mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: "toolfence://residuals/" + b.Key}})
	require.NoError(t, err)
	var rv mcpserver.ResidualView
	require.NoError(t, json.Unmarshal([]byte(rr.Contents[0].(mcp.TextResourceContents).Text), &rv))
	require.Equal(t, b.Key, rv.Key)
	require.Equal(t, residual.Succeeded, rv.State)
	_, err = c.ReadResource(ctx(t), mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: "toolfence://residuals/tf1_nope"}})
	require.Error(t, err)
	tpls, err := c.ListResourceTemplates(ctx(t), mcp.ListResourceTemplatesRequest{})
	require.NoError(t, err)
	var raws []string
	for _, tp := range tpls.ResourceTemplates {
		raws = append(raws, tp.URITemplate.Raw())
	}
	require.ElementsMatch(t, []string{mcpserver.ResidualURITemplate, mcpserver.PendingURI + "{?cursor}"}, raws)

	pr, err := c.GetPrompt(ctx(t), mcp.GetPromptRequest{Params: mcp.GetPromptParams{Name: "reconcile_task", Arguments: map[string]string{"task": task}}})
	require.NoError(t, err)
	require.Len(t, pr.Messages, 1)
	body := pr.Messages[0].Content.(mcp.TextContent).Text
	for _, want := range []string{"list_pending", "reconcile", "resolve_residual", "begin_call", open.Key, "1 open residual"} {
		require.Contains(t, body, want)
	}
	require.Contains(t, body, "lease_secret", "the prompt says what commit_call needs")
	require.NotContains(t, body, open.LeaseSecret, "the prompt never shows a secret")
}

// TestToolSchemas checks the advertised tools: reflected object schemas with the required
// fields, output schemas, and honest annotations.
func TestToolSchemas(t *testing.T) {
	t.Parallel()
	c := setup(t, nil).dial(tokA, legacy)
	tools, err := c.ListTools(ctx(t), mcp.ListToolsRequest{})
	require.NoError(t, err)
	required := map[string][]string{
		"list_pending": nil, "inspect_residual": {"key"}, "begin_call": {"args", "operation", "target", "task"},
		"commit_call": {"key", "lease_secret", "outcome", "token"}, "renew_lease": {"key", "lease_ms", "lease_secret", "token"},
		"resolve_residual": {"as", "key", "note"}, "reconcile": nil,
	}
	for _, tl := range tools.Tools {
		raw, err := json.Marshal(tl)
		require.NoError(t, err)
		var w struct {
			InputSchema struct {
				Type                 string         `json:"type"`
				Required             []string       `json:"required"`
				Properties           map[string]any `json:"properties"`
				AdditionalProperties *bool          `json:"additionalProperties"`
			} `json:"inputSchema"`
			OutputSchema struct {
				Type       string         `json:"type"`
				Properties map[string]any `json:"properties"`
			} `json:"outputSchema"`
			Annotations mcp.ToolAnnotation `json:"annotations"`
			Description string             `json:"description"`
		}
		require.NoError(t, json.Unmarshal(raw, &w), string(raw))
		require.Equal(t, "object", w.InputSchema.Type, tl.Name)
		want, known := required[tl.Name]
		require.True(t, known, tl.Name)
		got := slices.Clone(w.InputSchema.Required)
		slices.Sort(got)
		require.ElementsMatch(t, want, got, "%s required fields", tl.Name)
		require.NotNil(t, w.InputSchema.AdditionalProperties, tl.Name)
		require.False(t, *w.InputSchema.AdditionalProperties, "%s refuses unknown fields", tl.Name)
		require.Equal(t, "object", w.OutputSchema.Type, tl.Name)
		require.NotEmpty(t, w.OutputSchema.Properties, tl.Name)
		require.NotEmpty(t, w.Description, tl.Name)
		readOnly := tl.Name == "list_pending" || tl.Name == "inspect_residual"
		require.NotNil(t, w.Annotations.ReadOnlyHint, tl.Name)
		require.Equal(t, readOnly, *w.Annotations.ReadOnlyHint, "%s readOnlyHint", tl.Name)
	}
	for _, tl := range tools.Tools {
		raw, _ := json.Marshal(tl)
		var w struct {
			InputSchema struct {
				Properties map[string]struct {
					Type string   `json:"type"`
					Enum []string `json:"enum"`
				} `json:"properties"`
			} `json:"inputSchema"`
		}
		require.NoError(t, json.Unmarshal(raw, &w))
		switch tl.Name {
		case "begin_call":
			require.Equal(t, "object", w.InputSchema.Properties["args"].Type, "args is declared an object")
		case "commit_call":
			require.Equal(t, []string{"succeeded", "accepted", "failed", "unknown"}, w.InputSchema.Properties["outcome"].Enum)
			require.Equal(t, "integer", w.InputSchema.Properties["token"].Type)
			require.Equal(t, "string", w.InputSchema.Properties["lease_secret"].Type)
		case "resolve_residual":
			require.Equal(t, []string{"succeeded", "failed"}, w.InputSchema.Properties["as"].Enum)
		}
	}
}

// TestToolSchemasAreObjects: every tool's input and output schema, and every property and
// items schema inside them, is a JSON object, never a boolean schema: MCP hosts on the
// TypeScript SDK refuse the whole tool list otherwise (client.listTools throws).
func TestToolSchemasAreObjects(t *testing.T) {
	t.Parallel()
	c := setup(t, nil).dial(tokA, legacy)
	tools, err := c.ListTools(ctx(t), mcp.ListToolsRequest{})
	require.NoError(t, err)
	require.NotEmpty(t, tools.Tools)
	for _, tl := range tools.Tools {
		raw, err := json.Marshal(tl)
		require.NoError(t, err)
		var w struct {
			InputSchema  any `json:"inputSchema"`
			OutputSchema any `json:"outputSchema"`
		}
		require.NoError(t, json.Unmarshal(raw, &w))
		requireObjectSchema(t, tl.Name+".inputSchema", w.InputSchema)
		requireObjectSchema(t, tl.Name+".outputSchema", w.OutputSchema)
	}
}

// requireObjectSchema fails unless s, and every property and items schema under it, is a
// JSON object; path names the schema in the failure.
func requireObjectSchema(t *testing.T, path string, s any) {
	t.Helper()
	obj, isObject := s.(map[string]any)
	require.True(t, isObject, "%s is %#v, not an object schema", path, s)
	if props, has := obj["properties"]; has {
		pm, isObject := props.(map[string]any)
		require.True(t, isObject, "%s.properties is %#v, not an object", path, props)
		for name, p := range pm {
			requireObjectSchema(t, path+".properties."+name, p)
		}
	}
	if items, has := obj["items"]; has {
		requireObjectSchema(t, path+".items", items)
	}
}
