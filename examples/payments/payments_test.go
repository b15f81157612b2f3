package payments_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/examples/payments"
)

func connect(t *testing.T, b payments.Backend) *mcp.ClientSession {
	t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	ss, err := payments.NewServer(b).Connect(t.Context(), st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(t.Context(), ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func structured[T any](t *testing.T, res *mcp.CallToolResult) T {
	t.Helper()
	require.False(t, res.IsError, "%+v", res.Content)
	raw, err := json.Marshal(res.StructuredContent)
	require.NoError(t, err)
	var out T
	require.NoError(t, json.Unmarshal(raw, &out))
	return out
}

// TestPaymentsEveryChargeIsNew: the server does not deduplicate (two calls, two fsynced
// lines, ids ch_1 and ch_2); find_charge finds the first; the read tools are annotated
// read-only and charge is not; bad input charges nothing.
func TestPaymentsEveryChargeIsNew(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	cs := connect(t, &payments.FileLedger{Path: path})
	ctx := context.Background()
	call := func(name string, args map[string]any) *mcp.CallToolResult {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		require.NoError(t, err)
		return res
	}
	find := structured[payments.FindOut](t, call("find_charge", map[string]any{"order_id": "A-1"}))
	require.False(t, find.Found)
	for i, want := range []string{"ch_1", "ch_2"} {
		out := structured[payments.ChargeOut](t, call("charge", map[string]any{"order_id": "A-1", "amount_cents": 500 + i}))
		require.Equal(t, want, out.ChargeID)
	}
	bad := call("charge", map[string]any{"order_id": "A-2", "amount_cents": 0})
	require.True(t, bad.IsError)
	find = structured[payments.FindOut](t, call("find_charge", map[string]any{"order_id": "A-1"}))
	require.Equal(t, payments.FindOut{Found: true, ChargeID: "ch_1"}, find)
	list := structured[payments.ListOut](t, call("list_charges", map[string]any{}))
	require.Len(t, list.Charges, 2)
	onDisk, err := payments.ReadLedger(path)
	require.NoError(t, err)
	require.Equal(t, list.Charges[1].ID, onDisk[1].ID)

	tools, err := cs.ListTools(ctx, nil)
	require.NoError(t, err)
	ro := map[string]bool{}
	for _, tl := range tools.Tools {
		ro[tl.Name] = tl.Annotations.ReadOnlyHint
	}
	require.Equal(t, map[string]bool{"charge": false, "find_charge": true, "list_charges": true}, ro)
}
