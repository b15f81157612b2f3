package mcpserver_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpserver"
)

// TestListingsArePaged: resources/list, toolfence://pending, reconcile without a key and
// list_pending (by its limit, with filters) answer at most PageSize entries and say when
// more remain; following the cursors reaches
// every open residual exactly once (toolfence://pending used to stop at its first page
// with no way on, resources/list and reconcile answered everything at once).
func TestListingsArePaged(t *testing.T) {
	t.Parallel()
	const page, n = 4, 11
	e := setup(t, func(o *mcpserver.Options) { o.PageSize = page })
	c := e.dial(tokA, legacy)
	keys := map[string]bool{}
	for i := range n {
		b := ok[mcpserver.BeginResult](t, c, mcpserver.ToolBegin, m{"task": "t", "operation": "op", "target": fmt.Sprint("x", i), "args": m{}})
		keys[b.Key] = true
	}

	// resources/list: it follows the ledger through the watcher, so a residual opened a
	// moment ago may not be listed yet; page through it until the watcher has caught up.
	// Every pass must keep to the page size and list nothing twice.
	var seen map[string]bool
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		seen = map[string]bool{}
		var cursor mcp.Cursor
		for range n + 2 {
			var req mcp.ListResourcesRequest
			req.Params.Cursor = cursor
			res, err := c.ListResourcesByPage(ctx(t), req)
			require.NoError(ct, err)
			require.LessOrEqual(ct, len(res.Resources), page)
			for _, r := range res.Resources {
				require.False(ct, seen[r.URI], "listed twice: %s", r.URI)
				seen[r.URI] = true
			}
			if cursor = res.NextCursor; cursor == "" {
				break
			}
		}
		assert.Len(ct, seen, n+1, "every open residual and the pending list")
	}, 10*time.Second, 5*time.Millisecond)

	// toolfence://pending, page after page
	got := map[string]bool{}
	uri := mcpserver.PendingURI
	for range n + 2 {
		res, err := c.ReadResource(ctx(t), mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: uri}})
		require.NoError(t, err, uri)
		tc, isText := res.Contents[0].(mcp.TextResourceContents)
		require.True(t, isText)
		var p mcpserver.PendingPage
		require.NoError(t, json.Unmarshal([]byte(tc.Text), &p))
		require.LessOrEqual(t, len(p.Residuals), page)
		for _, r := range p.Residuals {
			require.False(t, got[r.Key])
			got[r.Key] = true
		}
		if p.NextCursor == "" {
			require.Empty(t, p.Next)
			break
		}
		require.NotEmpty(t, p.Next, "a page with more says where the next is")
		uri = p.Next
	}
	require.Equal(t, keys, got)

	// reconcile with no arguments
	got = map[string]bool{}
	in := m{}
	for range n + 2 {
		res := callTool(t, c, mcpserver.ToolReconcile, in)
		require.False(t, res.IsError, text(res))
		var r mcpserver.ReconcileResult
		require.NoError(t, json.Unmarshal(res.RawStructuredContent, &r))
		require.LessOrEqual(t, len(r.Unsettled)+len(r.Settled), page)
		for _, o := range r.Unsettled {
			got[o.Key] = true
		}
		if r.NextCursor == "" {
			break
		}
		require.Contains(t, text(res), "more remain")
		in = m{"cursor": r.NextCursor}
	}
	require.Equal(t, keys, got)

	// list_pending, filtered, by its own limit: the text and next_cursor say when more
	// remain, and only then.
	got = map[string]bool{}
	in = m{"task": "t", "operation": "op", "state": "pending", "limit": page}
	for range n + 2 {
		res := callTool(t, c, mcpserver.ToolListPending, in)
		require.False(t, res.IsError, text(res))
		var r mcpserver.ListResult
		require.NoError(t, json.Unmarshal(res.RawStructuredContent, &r))
		require.LessOrEqual(t, len(r.Residuals), page)
		for _, o := range r.Residuals {
			require.False(t, got[o.Key], "listed twice: %s", o.Key)
			got[o.Key] = true
		}
		if r.NextCursor == "" {
			require.NotContains(t, text(res), "more")
			break
		}
		require.Len(t, r.Residuals, page)
		require.Contains(t, text(res), "(more: pass next_cursor)")
		in["cursor"] = r.NextCursor
	}
	require.Equal(t, keys, got)
	none := callTool(t, c, mcpserver.ToolListPending, m{"task": "no-such-task"})
	require.False(t, none.IsError, text(none))
	require.Contains(t, text(none), "0 open residual(s)")
	require.NotContains(t, text(none), "more", "a filter that matches nothing says there is nothing more")
}
