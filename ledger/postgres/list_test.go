package postgres_test

import (
	"context"
	"encoding/json"

	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// Every filtered listing is an index scan that reads no row of the table but the ones it
// returns, so a listing costs what it answers, not the size of the namespace: over 5,000 residuals (a quarter of them open), a filter that
// matches nothing reads none of them.
func TestListFiltersUseIndexes(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	open(t, schema, postgres.Options{}) // migrates the schema
	ctx := context.Background()
	admin := adminConn(t, schema)
	_, err := admin.Exec(ctx, `INSERT INTO toolfence_residuals (namespace, key, task, operation, target, state,
		request_digest, token, att_n, att_holder, att_token, att_lease_expires, att_started,
		att_request_digest, att_outcome, att_released, created_at, updated_at)
	SELECT 'plan', 'tf1_' || encode(sha256(i::text::bytea), 'hex'), 'task-' || i % 50, 'op-' || i % 5,
		'item:' || i, CASE WHEN i % 4 = 0 THEN 'pending' ELSE 'succeeded' END, 'd', 1, 1, 'agent', 1, now(), now(), 'd',
		CASE WHEN i % 4 = 0 THEN '' ELSE 'succeeded' END, i % 4 <> 0, now(), now()
	FROM generate_series(1, 5000) i`)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `ANALYZE toolfence_residuals`)
	require.NoError(t, err)

	openStates := []residual.State{residual.Pending, residual.Unknown, residual.Accepted}
	for _, tc := range []struct {
		p ledger.ListParams
		// removed is how many rows the scan may read and drop: a combination of filters
		// reads the rows of its most selective field (here the one residual of item:1).
		removed float64
	}{
		{ledger.ListParams{Task: "none", States: openStates}, 0},
		{ledger.ListParams{Operation: "none", States: openStates}, 0},
		{ledger.ListParams{Target: "none", States: openStates}, 0},
		{ledger.ListParams{Task: "none"}, 0},
		{ledger.ListParams{States: openStates}, 0},
		{ledger.ListParams{States: []residual.State{residual.Unknown}}, 0},
		{ledger.ListParams{Task: "none", Operation: "op-1", Target: "item:1", States: openStates}, 1},
	} {
		p := tc.p
		p.Namespace = "plan"
		sql, args := postgres.ListQuery(p)
		var plan []map[string]any
		var raw []byte
		require.NoError(t, admin.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&raw))
		require.NoError(t, json.Unmarshal(raw, &plan))
		text := string(raw)
		require.NotContains(t, text, `"Seq Scan"`, "filter %+v:\n%s", p, text)
		require.Contains(t, text, "Index", "filter %+v:\n%s", p, text)
		require.LessOrEqual(t, rowsRemoved(plan[0]["Plan"]), tc.removed, "filter %+v reads rows it does not return:\n%s", p, text)
	}
}

// rowsRemoved sums the rows every node of an EXPLAIN ANALYZE plan read and then dropped
// by a filter.
func rowsRemoved(node any) float64 {
	m, ok := node.(map[string]any)
	if !ok {
		return 0
	}
	var n float64
	for k, v := range m {
		if strings.HasPrefix(k, "Rows Removed by") {
			f, _ := v.(float64)
			n += f
		}
	}
	if kids, ok := m["Plans"].([]any); ok {
		for _, k := range kids {
			n += rowsRemoved(k)
		}
	}
	return n
}
