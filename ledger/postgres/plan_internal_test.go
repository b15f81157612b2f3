package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/residual"
)

// genericPlan prepares sql on the ledger's schema, runs settings first in the same
// transaction (none when empty), and returns the generic plan of sql with args, as EXPLAIN
// prints it (JSON): the plan a connection keeps once it has made it.
func genericPlan(t *testing.T, l *Ledger, settings, sql string, args ...any) map[string]any {
	t.Helper()
	ctx := context.Background()
	c, err := l.pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	tx, err := c.Begin(ctx)
	require.NoError(t, err)
	defer func() {
		_ = tx.Rollback(ctx)
		_, _ = c.Exec(ctx, `DEALLOCATE planned`) // a prepared statement outlives its transaction
	}()
	_, err = tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	if settings != "" {
		_, err = tx.Exec(ctx, settings)
		require.NoError(t, err)
	}
	_, err = tx.Exec(ctx, `PREPARE planned AS `+sql)
	require.NoError(t, err)
	lits := make([]string, len(args))
	for i, a := range args {
		lits[i] = literal(t, a)
	}
	var raw []byte
	require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE planned(`+strings.Join(lits, ", ")+`)`).Scan(&raw))
	var plan []map[string]any
	require.NoError(t, json.Unmarshal(raw, &plan))
	return plan[0]["Plan"].(map[string]any)
}

// literal writes a as an SQL literal of EXECUTE's argument list (EXPLAIN takes no
// parameters); the prepared statement's parameter types convert it.
func literal(t *testing.T, a any) string {
	t.Helper()
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	array := func(items []string) string { return quote("{" + strings.Join(items, ",") + "}") }
	switch v := a.(type) {
	case nil:
		return "NULL"
	case string:
		return quote(v)
	case int, int32, int64, bool:
		return fmt.Sprint(v)
	case time.Time:
		return quote(v.Format(time.RFC3339Nano))
	case *time.Time:
		if v == nil {
			return "NULL"
		}
		return quote(v.Format(time.RFC3339Nano))
	case []byte:
		return fmt.Sprintf(`'\x%x'`, v)
	case []string:
		items := make([]string, len(v))
		for i, x := range v {
			items[i] = `"` + x + `"`
		}
		return array(items)
	case []int32, []int64, []bool:
		return array(strings.Fields(strings.Trim(fmt.Sprint(v), "[]")))
	case [][]byte:
		items := make([]string, len(v))
		for i, x := range v {
			items[i] = "NULL"
			if x != nil {
				items[i] = fmt.Sprintf(`"\\x%x"`, x)
			}
		}
		return array(items)
	}
	t.Fatalf("literal: no SQL literal for %T", a)
	return ""
}

// newPlanLedger opens a ledger on a new schema of its own, closed when t ends.
func newPlanLedger(t *testing.T) *Ledger {
	t.Helper()
	l, err := Open(context.Background(), testkit.PostgresDSN(t), Options{Schema: testkit.Schema(t, "toolfence_test_plan_")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// scans lists the plan's scans of toolfence_residuals, depth first, as
// "node type/index name/index condition".
func scans(node map[string]any) []string {
	var out []string
	if typ, _ := node["Node Type"].(string); node["Relation Name"] == "toolfence_residuals" && strings.HasSuffix(typ, "Scan") {
		out = append(out, fmt.Sprintf("%v/%v/%v", node["Node Type"], node["Index Name"], node["Index Cond"]))
	}
	kids, _ := node["Plans"].([]any)
	for _, k := range kids {
		out = append(out, scans(k.(map[string]any))...)
	}
	return out
}

// The reads and writes of one key (get, peek, lock, commit, renew, and the write of the
// locking paths) find its row through the primary key (or the open residuals' index, which
// has the same columns), both columns as the index condition, even in the generic plan made
// on a new, empty table: a connection keeps that plan, and an index that only begins with
// the namespace would read the whole namespace for each call. The filter indexes lead with
// their field since migration 0007; before, the generic plans of get, peek, lock and the
// write read toolfence_residuals_target.
func TestKeyLookupsReadOneRowOnANewTable(t *testing.T) {
	t.Parallel()
	l := newPlanLedger(t)
	key := residual.Key("ns", "t", "op", "x")
	byKey := []string{"toolfence_residuals_pkey", "toolfence_residuals_open_key"}
	now := time.Now()
	write, err := writeArgs(&residual.Residual{Namespace: "ns", Key: key, Task: "t", Operation: "op", Target: "x",
		State: residual.Succeeded, CreatedAt: now, UpdatedAt: now}, "")
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		sql  string
		args []any
	}{
		{"get", getSQL, []any{"ns", key, int64(0)}},
		{"peek", peekSQL, []any{"ns", key, int64(0)}},
		{"lock", lockSQL, []any{"ns", key, int64(0)}},
		{"commit", commitSQL[1][1], []any{"ns", key, "h", int64(1), "succeeded", "", "", int64(0), int64(0), []byte("{}"), "", false, ""}},
		{"renew", renewSQL, []any{"ns", key, "h", int64(1), int64(1000), int64(0)}},
		{"write", writeSQL[1], write},
	} {
		s := scans(genericPlan(t, l, "", tc.sql, tc.args...))
		require.Len(t, s, 1, "%s: %v", tc.name, s)
		require.True(t, slices.ContainsFunc(byKey, func(ix string) bool { return strings.HasPrefix(s[0], "Index Scan/"+ix+"/") }),
			"%s reads its row through %v", tc.name, s)
		require.Contains(t, s[0], "namespace = ", tc.name)
		require.Contains(t, s[0], "key = ", tc.name)
	}
}

// A shared commit's generic plan, made on a new, empty table, reads each array element's
// row by key: a nested loop over the arrays with the primary key inside, never a hash or
// merge join, a bitmap, a sequential scan or a whole read of the open residuals' index
// (each of which the planner chose there before sharedSettingsSQL and $16, and which read
// every open residual, dead index entries included, on every shared commit).
func TestSharedCommitReadsRowsByKey(t *testing.T) {
	t.Parallel()
	l := newPlanLedger(t)
	k1, k2 := residual.Key("ns", "t", "op", "1"), residual.Key("ns", "t", "op", "2")
	plan := genericPlan(t, l, sharedSettingsSQL, commitManySQL[1],
		[]int32{0, 1}, []string{"ns", "ns"}, []string{k1, k2}, []string{"h", "h"}, []int64{1, 1},
		[]string{"succeeded", "succeeded"}, []string{"", ""}, []string{"", ""}, []int64{0, 0}, []bool{true, true},
		[][]byte{nil, nil}, []string{"", ""}, []bool{false, false}, []string{"", ""}, int64(0), "pending")
	loop := plan["Plans"].([]any)
	var join map[string]any
	for _, p := range loop {
		if m := p.(map[string]any); m["Parent Relationship"] == "Outer" || m["Parent Relationship"] == "Member" {
			join = m
		}
	}
	require.NotNil(t, join, "the update's input: %v", plan)
	require.Equal(t, "Nested Loop", join["Node Type"], "%v", join)
	sides := join["Plans"].([]any)
	require.Len(t, sides, 2)
	outer, inner := sides[0].(map[string]any), sides[1].(map[string]any)
	require.Equal(t, "Function Scan", outer["Node Type"], "the arrays drive the loop: %v", join)
	require.Equal(t, []string{"Index Scan/toolfence_residuals_pkey/((namespace = b.bns) AND (key = b.bkey))"}, scans(inner))
}
