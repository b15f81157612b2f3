package postgres_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/ledgertest"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// guardedCall is one guarded call of a no-op tool: reserve, (dispatch nothing), commit.
func guardedCall(b *testing.B, l *postgres.Ledger, target string) {
	reserveSettle(b, l, ledger.ReserveParams{
		Namespace: "bench", Key: residual.Key("bench", "task", "noop", target), Task: "task",
		Operation: "noop", Target: target, Holder: "bench-agent", RequestDigest: "d", TTL: 30 * time.Second,
	}, residual.Succeeded)
}

// reserveSettle reserves p, requires Acquired and commits outcome (a failed one with an
// error text, a succeeded one with a small result).
func reserveSettle(b *testing.B, l ledger.Ledger, p ledger.ReserveParams, outcome residual.State) {
	ctx := context.Background()
	res, err := l.Reserve(ctx, p)
	if err != nil || res.Decision != ledger.Acquired {
		b.Fatalf("reserve: %v %v", res, err)
	}
	cp := ledger.CommitParams{
		Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
		Outcome: outcome, Result: []byte(`{}`), Margin: 50 * time.Millisecond,
	}
	if outcome == residual.Failed {
		cp.Result, cp.Error = nil, "upstream said no"
	}
	if _, err := l.Commit(ctx, cp); err != nil {
		b.Fatalf("commit: %v", err)
	}
}

// warmUp runs guarded calls from callers goroutines at once, so that every pooled connection
// is established and has its statements prepared before the timer starts.
func warmUp(b *testing.B, l *postgres.Ledger, callers int) {
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for i := range 3 {
				guardedCall(b, l, fmt.Sprintf("warmup:%d:%d", g, i))
			}
		})
	}
	wg.Wait()
}

// settle runs a CHECKPOINT before a benchmark's timed part, so that no benchmark runs while
// a timed checkpoint of an earlier one writes the data files: the sequential benchmarks the
// targets compare (guarded and naive) each start on a freshly checkpointed server. A role that
// may not checkpoint (neither superuser nor pg_checkpoint) measures without it, and says so.
func settle(b *testing.B, schema string) {
	b.Helper()
	if _, err := adminConn(b, schema).Exec(context.Background(), `CHECKPOINT`); err != nil {
		b.Logf("no CHECKPOINT before the benchmark (%v): a timed checkpoint may fall inside it", err)
	}
}

// BenchmarkPostgresGuardedCall: sequential guarded calls of a no-op tool, each on a new key:
// two statements (reserve, commit), each its own durable transaction.
func BenchmarkPostgresGuardedCall(b *testing.B) {
	schema := newSchema(b)
	l := open(b, schema, postgres.Options{MaxConns: 1})
	reportWrites(b, l, schema, guardedCalls(b, l, schema, 1))
}

// reportWrites closes l and reports what the guarded calls (calls of them, warm-up
// included) wrote on schema, from PostgreSQL's statistics of the schema's tables
// (pg_stat_user_tables) and its indexes (pg_index):
//
//   - index-entries/op: index entries written per call. An inserted row and an update that
//     is not HOT add one entry to each full index of the table; a HOT update and a delete
//     add none. A partial index takes only the row versions its predicate admits: here every
//     insert is an open residual (admitted by the partial indexes of the open residuals) and
//     every update settles one (not admitted), so a partial index counts the inserts alone.
//   - heap-rows/op: row versions written per call (inserts and updates, every table).
//   - HOT-%: the share of the residual table's updates that were HOT.
//
// Backends publish their counters when they go idle (at most once a second) and when they
// exit, so the ledger's pool is closed first and the counters are read until the inserts
// of every call show.
func reportWrites(b *testing.B, l *postgres.Ledger, schema string, calls int) {
	b.Helper()
	b.StopTimer()
	require.NoError(b, l.Close())
	admin := adminConn(b, schema)
	ctx := context.Background()
	var entries, rows, upd, hot int64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var ins int64
		entries, rows, upd, hot = 0, 0, 0, 0
		r, err := admin.Query(ctx, `SELECT s.relname, s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd,
			(SELECT count(*) FROM pg_index i WHERE i.indrelid = s.relid AND i.indpred IS NULL),
			(SELECT count(*) FROM pg_index i WHERE i.indrelid = s.relid AND i.indpred IS NOT NULL)
		FROM pg_stat_user_tables s WHERE s.schemaname = $1`, schema)
		require.NoError(b, err)
		for r.Next() {
			var name string
			var ti, tu, th, full, partial int64
			require.NoError(b, r.Scan(&name, &ti, &tu, &th, &full, &partial))
			entries += (ti+tu-th)*full + ti*partial
			rows += ti + tu
			if name == "toolfence_residuals" {
				ins, upd, hot = ti, tu, th
			}
		}
		require.NoError(b, r.Err())
		if ins >= int64(calls) {
			break
		}
		if time.Now().After(deadline) {
			b.Logf("statistics show %d of %d reserves: no write figures", ins, calls)
			return
		}
	}
	b.ReportMetric(float64(entries)/float64(calls), "index-entries/op")
	b.ReportMetric(float64(rows)/float64(calls), "heap-rows/op")
	if upd > 0 {
		b.ReportMetric(100*float64(hot)/float64(upd), "HOT-%")
	}
}

// BenchmarkNaiveBaseline is the pattern of the common idempotency middleware, the baseline
// toolfence must not be slower than: SELECT the key's record; INSERT a pending row; (run the
// tool); UPDATE it to completed. Three autocommit statements on the table such middleware
// usually creates (idempotency_store, with a CHECK on status and a created_at default) and
// its usual statements (an insert with a client-computed expires_at, a mark_completed with
// `AND status = 'pending'`); no lease, no fencing, and the check-then-insert race intact.
// Keys are toolfence's (longer than the middleware's), so both sides compare the same keys.
func BenchmarkNaiveBaseline(b *testing.B) {
	benchNaive(b, `CREATE TABLE idempotency_store (
		idempotency_key TEXT PRIMARY KEY,
		status TEXT NOT NULL CHECK(status IN ('pending', 'completed', 'failed')),
		result_json TEXT,
		error_message TEXT,
		created_at TIMESTAMPTZ DEFAULT CURRENT_TIMESTAMP,
		expires_at TIMESTAMPTZ NOT NULL)`,
		`SELECT status, result_json, error_message, created_at, expires_at FROM idempotency_store WHERE idempotency_key = $1`,
		`INSERT INTO idempotency_store (idempotency_key, status, expires_at) VALUES ($1, 'pending', $2)`,
		`UPDATE idempotency_store SET status = 'completed', result_json = $2 WHERE idempotency_key = $1 AND status = 'pending'`,
		true, `{}`)
}

// BenchmarkNaiveBaselineMinimal is the same pattern on the smallest table that can carry it
// (key, status, result, expiry; no CHECK), the baseline of the first measurements: kept so
// that the figures can be compared with them (docs/benchmarks.md).
func BenchmarkNaiveBaselineMinimal(b *testing.B) {
	benchNaive(b, `CREATE TABLE idempotency_store (
		idempotency_key text PRIMARY KEY, status text NOT NULL, result bytea, expires_at timestamptz NOT NULL)`,
		`SELECT status FROM idempotency_store WHERE idempotency_key = $1`,
		`INSERT INTO idempotency_store (idempotency_key, status, expires_at) VALUES ($1, 'pending', now() + interval '1 day')`,
		`UPDATE idempotency_store SET status = 'completed', result = $2 WHERE idempotency_key = $1`,
		false, []byte(`{}`))
}

// benchNaive runs the naive pattern sequentially on one connection: get (a read that finds
// nothing), insert pending (the key, and the expiry when clientExpiry), complete (the key,
// result).
func benchNaive(b *testing.B, table, get, insert, complete string, clientExpiry bool, result any) {
	schema := newSchema(b)
	ctx := context.Background()
	admin := adminConn(b, schema)
	testkit.CreateSchema(b, schema)
	_, err := admin.Exec(ctx, table)
	require.NoError(b, err)
	cfg, err := pgxpool.ParseConfig(testDSN())
	require.NoError(b, err)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	call := func(key string) {
		rows, err := pool.Query(ctx, get, key)
		if err != nil {
			b.Fatal(err)
		}
		found := rows.Next()
		rows.Close()
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		if found {
			return // cached or pending: not executed again
		}
		args := []any{key}
		if clientExpiry {
			args = append(args, time.Now().Add(24*time.Hour))
		}
		if _, err := pool.Exec(ctx, insert, args...); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, complete, key, result); err != nil {
			b.Fatal(err)
		}
	}
	call("warmup")
	settle(b, schema)
	for i := 0; b.Loop(); i++ {
		call(residual.Key("bench", "task", "noop", "naive:"+strconv.Itoa(i)))
	}
}

// BenchmarkPostgresGuardedCallParallel: guarded calls from 8 and 64 concurrent callers, the
// pool sized to match; ns/op is wall time per call across all callers.
func BenchmarkPostgresGuardedCallParallel(b *testing.B) {
	for _, callers := range []int{8, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			schema := newSchema(b)
			l := open(b, schema, postgres.Options{MaxConns: int32(callers)})
			reportWrites(b, l, schema, guardedCalls(b, l, schema, callers))
		})
	}
}

// guardedCalls warms l up for callers, checkpoints and times guarded calls on new keys:
// sequential ones (b.Loop) for one caller, b.RunParallel's for more. It returns the calls
// made, warm-up included, for reportWrites.
func guardedCalls(b *testing.B, l *postgres.Ledger, schema string, callers int) int {
	if callers == 1 {
		guardedCall(b, l, "warmup") // prepares the statements
		settle(b, schema)
		calls := 1
		for i := 0; b.Loop(); i++ {
			guardedCall(b, l, "seq:"+strconv.Itoa(i))
			calls++
		}
		return calls
	}
	warmUp(b, l, callers)
	settle(b, schema)
	var n atomic.Int64
	b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			guardedCall(b, l, "par:"+strconv.FormatInt(n.Add(1), 10))
		}
	})
	return 3*callers + int(n.Load())
}

// BenchmarkPostgresIndexCost prices the residual table's secondary indexes in one run
// (issue 27): the sequential guarded call and 8 callers' on the schema as migrated
// (indexes=all), with the three filter indexes dropped (indexes=primary-key+open: the
// primary key and the open residuals' index), with the open residuals' index dropped
// (indexes=primary-key+filters: it fails unless no index left names the state, so a commit
// can be HOT and then writes no index entry: the fewest index writes of any layout that
// keeps the filter indexes) and with the primary key alone (indexes=primary-key, the schema
// of ba171e9). The indexes are dropped from the benchmark's own schema after the
// migrations. primary-key+open and primary-key drop every index but the primary key
// (and, for the first, the open index), whatever it is, so an index a later migration adds
// is priced there; the open index is named, so renamed, the benchmark fails rather than
// price the wrong set. benchcheck prints all ÷ primary-key and all ÷ primary-key+open for
// both loads, and at 8 callers all ÷ primary-key+filters and primary-key+filters ÷
// primary-key, per round.
func BenchmarkPostgresIndexCost(b *testing.B) {
	const openIndex = "toolfence_residuals_open_key"
	for _, v := range []struct {
		name    string
		prepare func(b *testing.B, schema string) // changes the migrated indexes, if at all
	}{
		{"all", func(*testing.B, string) {}},
		{"primary-key+open", func(b *testing.B, schema string) { keepIndexes(b, schema, openIndex) }},
		{"primary-key+filters", func(b *testing.B, schema string) {
			dropIndex(b, schema, openIndex)
			requireNoIndexNamesState(b, schema)
		}},
		{"primary-key", func(b *testing.B, schema string) { keepIndexes(b, schema, "") }},
	} {
		for _, callers := range []int{1, 8} {
			load := "sequential"
			if callers > 1 {
				load = fmt.Sprintf("callers=%d", callers)
			}
			b.Run("indexes="+v.name+"/"+load, func(b *testing.B) {
				schema := newSchema(b)
				l := open(b, schema, postgres.Options{MaxConns: int32(callers)})
				v.prepare(b, schema)
				reportWrites(b, l, schema, guardedCalls(b, l, schema, callers))
			})
		}
	}
}

// dropIndex drops the index name in schema, failing if there is none.
func dropIndex(b *testing.B, schema, name string) {
	b.Helper()
	_, err := adminConn(b, schema).Exec(context.Background(), `DROP INDEX `+pgx.Identifier{schema, name}.Sanitize())
	require.NoError(b, err, "dropping the index %s", name)
}

// requireNoIndexNamesState fails if an index of schema's residual table names the state
// column (as a key, in an expression or in its predicate): while one does, no commit that
// settles a residual is HOT.
func requireNoIndexNamesState(b *testing.B, schema string) {
	b.Helper()
	var naming []string
	err := adminConn(b, schema).QueryRow(context.Background(), `SELECT coalesce(array_agg(c.relname), '{}')
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = 'toolfence_residuals'::regclass AND (
			EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) AND a.attname = 'state')
			OR coalesce(pg_get_expr(i.indexprs, i.indrelid), '') ~ '\mstate\M'
			OR coalesce(pg_get_expr(i.indpred, i.indrelid), '') ~ '\mstate\M')`).Scan(&naming)
	require.NoError(b, err)
	require.Empty(b, naming, "indexes that name the state (commits cannot be HOT)")
}

// keepIndexes drops every index of schema's residual table but its primary key and the
// index named keep (none when empty), and fails unless what is left is exactly that.
func keepIndexes(b *testing.B, schema, keep string) {
	b.Helper()
	ctx := context.Background()
	admin := adminConn(b, schema)
	const list = `SELECT c.relname, i.indisprimary FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = 'toolfence_residuals'::regclass ORDER BY c.relname`
	names := func() (primary, others []string) {
		r, err := admin.Query(ctx, list)
		require.NoError(b, err)
		for r.Next() {
			var name string
			var isPrimary bool
			require.NoError(b, r.Scan(&name, &isPrimary))
			if isPrimary {
				primary = append(primary, name)
			} else {
				others = append(others, name)
			}
		}
		require.NoError(b, r.Err())
		return primary, others
	}
	_, others := names()
	for _, name := range others {
		if name != keep {
			dropIndex(b, schema, name)
		}
	}
	primary, others := names()
	var want []string
	if keep != "" {
		want = []string{keep}
	}
	require.Len(b, primary, 1, "the residual table's primary key")
	require.ElementsMatch(b, want, others, "indexes left besides the primary key")
}

// BenchmarkPostgresGuardedCallWatched: guarded calls while one Watch listens. Writers
// notify only while a watch is registered, and PostgreSQL serialises the commits of
// notifying transactions (a database-wide lock held through the WAL flush), so this
// measures what change notifications cost, inside the write's transaction and after it.
func BenchmarkPostgresGuardedCallWatched(b *testing.B) {
	for _, c := range []struct {
		callers     int
		afterCommit bool
	}{{64, false}, {64, true}} {
		mode := map[bool]string{false: "in-tx", true: "after-commit"}[c.afterCommit]
		callers := c.callers
		b.Run(fmt.Sprintf("notify=%s/callers=%d", mode, callers), func(b *testing.B) {
			schema := newSchema(b)
			l := open(b, schema, postgres.Options{MaxConns: int32(callers), NotifyAfterCommit: c.afterCommit})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ch, err := l.Watch(ctx, "")
			require.NoError(b, err)
			go func() {
				for range ch { // drain until the watch ends
				}
			}()
			guardedCalls(b, l, schema, callers)
		})
	}
}

// BenchmarkPostgresCycle600 times the begin → failed commit cycles of one key from the
// 600th on (599 cycles before them are untimed, once): what a key that keeps failing costs
// once attempts pile up. A residual keeps its first and latest 16 attempts, so every timed
// cycle meets the same history, and the time must not grow with the count. (It used to
// build a fresh key of 599 untimed cycles per timed one, which made make bench's run of it
// last many minutes.)
func BenchmarkPostgresCycle600(b *testing.B) {
	l := open(b, newSchema(b), postgres.Options{MaxConns: 1})
	p := params("cycle", "bench-agent")
	for range 599 {
		reserveSettle(b, l, p, residual.Failed)
	}
	for b.Loop() {
		reserveSettle(b, l, p, residual.Failed)
	}
}

// fillSettled inserts n succeeded residuals into namespace "bench" of schema with one
// statement (spread over 100 tasks, 10 operations and n targets), then one live pending
// residual (task "task-open") through the ledger, and analyzes the table.
func fillSettled(b *testing.B, l *postgres.Ledger, schema string, n int) {
	admin := adminConn(b, schema)
	ctx := context.Background()
	_, err := admin.Exec(ctx, `INSERT INTO toolfence_residuals (namespace, key, task, operation, target, state,
		request_digest, token, att_n, att_holder, att_token, att_lease_expires, att_started, att_ended,
		att_request_digest, att_outcome, att_released, result, created_at, updated_at)
	SELECT 'bench', 'tf1_' || encode(sha256(i::text::bytea), 'hex'), 'task-' || i % 100, 'op-' || i % 10,
		'item:' || i, 'succeeded', 'd', 1, 1, 'agent', 1, now(), now(), now(), 'd', 'succeeded', true,
		'{"ok":true}', now(), now()
	FROM generate_series(1, $1) i`, n)
	require.NoError(b, err)
	p := ledger.ReserveParams{
		Namespace: "bench", Key: residual.Key("bench", "task-open", "op-0", "open"), Task: "task-open",
		Operation: "op-0", Target: "open", Holder: "agent", RequestDigest: "d", TTL: time.Hour,
	}
	res, err := l.Reserve(ctx, p)
	require.NoError(b, err)
	require.Equal(b, ledger.Acquired, res.Decision)
	_, err = admin.Exec(ctx, `ANALYZE toolfence_residuals`)
	require.NoError(b, err)
}

// BenchmarkPostgresListFiltered lists one page of a namespace of 20,000 settled residuals
// with the filters of list_pending (the open states): a task that matches nothing, and no
// field filter at all (one open residual among 20,000 settled ones). A filter that matches nothing must
// not read the namespace.
func BenchmarkPostgresListFiltered(b *testing.B) {
	schema := newSchema(b)
	l := open(b, schema, postgres.Options{MaxConns: 1})
	fillSettled(b, l, schema, 20_000)
	ledgertest.BenchListFiltered(b, l, "bench")
}
