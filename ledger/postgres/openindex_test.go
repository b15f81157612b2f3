package postgres_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// Migration 0006 upgrades a store that has open residuals among settled ones: the gauges
// count the same open residuals before and after, through the index of the open residuals
// that is left (never a scan of the settled ones), and the open listing finds them all; the
// up SQL runs again over itself, and down and up again change nothing.
func TestMigrationOneOpenIndexUpgrade(t *testing.T) {
	t.Parallel()
	schema, opts := migrated(t)
	ctx := context.Background()
	admin := adminConn(t, schema)
	_, _, err := postgres.MigrateDown(ctx, testDSN(), 5, postgres.DownOptions{Options: opts})
	require.NoError(t, err)
	// A store at version 5: 600 residuals in every state over two namespaces (tombstones
	// included), as an older toolfence wrote them, and 5,000 settled ones.
	_, err = admin.Exec(ctx, `INSERT INTO toolfence_residuals (namespace, key, task, operation, target, state,
		request_digest, token, att_n, att_holder, att_token, att_lease_expires, att_started,
		att_request_digest, att_outcome, att_released, created_at, updated_at)
	SELECT 'ns-' || i % 2, 'tf1_' || encode(sha256(i::text::bytea), 'hex'), 'task-' || i % 3, 'op', 'item:' || i,
		CASE WHEN i > 600 THEN 'succeeded' ELSE (ARRAY['pending', 'unknown', 'accepted', 'succeeded', 'failed', 'collected'])[1 + i % 6] END,
		'd', 1, 1, 'agent', 1, now() + interval '1 hour', now(), 'd',
		CASE WHEN i > 600 THEN 'succeeded' WHEN i % 6 IN (0, 5) THEN '' ELSE (ARRAY['pending', 'unknown', 'accepted', 'succeeded', 'failed', 'collected'])[1 + i % 6] END,
		i > 600 OR i % 6 NOT IN (0, 5), now(), now()
	FROM generate_series(1, 5600) i`)
	require.NoError(t, err)
	// counts runs the gauges' statement (the same at version 5 and 6) by effective state.
	counts := func() map[string]int64 {
		rows, err := admin.Query(ctx, postgres.OpenSQL, int64(0))
		require.NoError(t, err)
		out := map[string]int64{}
		for rows.Next() {
			var s string
			var n int64
			var oldest any
			require.NoError(t, rows.Scan(&s, &n, &oldest))
			out[s] = n
		}
		require.NoError(t, rows.Err())
		return out
	}
	want := map[string]int64{"pending": 100, "unknown": 100, "accepted": 100}
	_, _, err = postgres.Migrate(ctx, testDSN(), opts)
	require.NoError(t, err)
	require.Equal(t, want, counts())
	_, err = admin.Exec(ctx, `ANALYZE toolfence_residuals`)
	require.NoError(t, err)
	var raw []byte
	require.NoError(t, admin.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+postgres.OpenSQL, int64(0)).Scan(&raw))
	var plan []map[string]any
	require.NoError(t, json.Unmarshal(raw, &plan))
	require.Empty(t, seqScans(plan[0]["Plan"]), "the gauges read the open residuals only:\n%s", raw)
	require.Contains(t, string(raw), "toolfence_residuals_open_key")

	l := open(t, schema, postgres.Options{})
	gauges, err := l.OpenResiduals(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{100, 100, 100}, []int64{gauges[0].Count, gauges[1].Count, gauges[2].Count})
	var listed int
	for _, n := range []string{"ns-0", "ns-1"} {
		for cursor := ""; ; {
			page, err := l.List(ctx, ledger.ListParams{Namespace: n, Cursor: cursor, Limit: 70,
				States: []residual.State{residual.Pending, residual.Unknown, residual.Accepted}})
			require.NoError(t, err)
			listed += len(page.Residuals)
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
	}
	require.Equal(t, 300, listed)

	_, err = admin.Exec(ctx, `DELETE FROM toolfence_schema_migrations WHERE version >= 6`)
	require.NoError(t, err)
	from, to, err := postgres.Migrate(ctx, testDSN(), opts)
	require.NoError(t, err, "the up SQL of 0006 and later runs again over itself")
	require.Equal(t, [2]int{5, postgres.LatestVersion()}, [2]int{from, to})
	_, _, err = postgres.MigrateDown(ctx, testDSN(), 5, postgres.DownOptions{Options: opts})
	require.NoError(t, err)
	require.Equal(t, want, counts(), "at version 5 again")
	_, _, err = postgres.Migrate(ctx, testDSN(), opts)
	require.NoError(t, err)
	require.Equal(t, want, counts())
}

// seqScans returns the relations that the nodes of an EXPLAIN plan read by sequential scan.
func seqScans(node any) []string {
	m, ok := node.(map[string]any)
	if !ok {
		return nil
	}
	var out []string
	if m["Node Type"] == "Seq Scan" {
		out = append(out, m["Relation Name"].(string))
	}
	if kids, ok := m["Plans"].([]any); ok {
		for _, k := range kids {
			out = append(out, seqScans(k)...)
		}
	}
	return out
}
