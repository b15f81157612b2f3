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

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// guardedCall is one guarded call of a no-op tool: reserve, (dispatch nothing), commit.
func guardedCall(b *testing.B, l *postgres.Ledger, target string) {
	p := ledger.ReserveParams{
		Namespace: "bench", Key: residual.Key("bench", "task", "noop", target), Task: "task",
		Operation: "noop", Target: target, Holder: "bench-agent", RequestDigest: "d", TTL: 30 * time.Second,
	}
	ctx := context.Background()
	res, err := l.Reserve(ctx, p)
	if err != nil || res.Decision != ledger.Acquired {
		b.Fatalf("reserve: %v %v", res, err)
	}
	if _, err := l.Commit(ctx, ledger.CommitParams{
		Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
		Outcome: residual.Succeeded, Result: []byte(`{}`), Margin: 50 * time.Millisecond,
	}); err != nil {
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

// BenchmarkPostgresGuardedCall: sequential guarded calls of a no-op tool, each on a new key:
// two statements (reserve, commit), each its own durable transaction.
func BenchmarkPostgresGuardedCall(b *testing.B) {
	l := open(b, newSchema(b), postgres.Options{MaxConns: 1})
	guardedCall(b, l, "warmup") // prepares the statements
	for i := 0; b.Loop(); i++ {
		guardedCall(b, l, "seq:"+strconv.Itoa(i))
	}
}

// BenchmarkPostgresGuardedCallParallel: guarded calls from 8 and 64 concurrent callers, the
// pool sized to match; ns/op is wall time per call across all callers.
func BenchmarkPostgresGuardedCallParallel(b *testing.B) {
	for _, callers := range []int{8, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			l := open(b, newSchema(b), postgres.Options{MaxConns: int32(callers)})
			warmUp(b, l, callers)
			var n atomic.Int64
			b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					guardedCall(b, l, "par:"+strconv.FormatInt(n.Add(1), 10))
				}
			})
		})
	}
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
			l := open(b, newSchema(b), postgres.Options{MaxConns: int32(callers), NotifyAfterCommit: c.afterCommit})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ch, err := l.Watch(ctx, "")
			require.NoError(b, err)
			go func() {
				for range ch { // drain until the watch ends
				}
			}()
			warmUp(b, l, callers)
			var n atomic.Int64
			b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					guardedCall(b, l, "watched:"+strconv.FormatInt(n.Add(1), 10))
				}
			})
		})
	}
}

// BenchmarkNaiveBaseline is the pattern of seed 003's idempotency middleware, the baseline
// toolfence must not be slower than: SELECT the key; INSERT a pending row; (run the tool);
// UPDATE it to completed. Three autocommit statements on a plain table (indexed by key so
// that lookups stay cheap), no lease, no fencing, and the check-then-insert race intact.
func BenchmarkNaiveBaseline(b *testing.B) {
	schema := newSchema(b)
	ctx := context.Background()
	admin := adminConn(b, schema)
	_, err := admin.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize())
	require.NoError(b, err)
	_, err = admin.Exec(ctx, `CREATE TABLE idempotency_store (
		idempotency_key text PRIMARY KEY, status text NOT NULL, result bytea, expires_at timestamptz NOT NULL)`)
	require.NoError(b, err)
	cfg, err := pgxpool.ParseConfig(testDSN())
	require.NoError(b, err)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	call := func(key string) {
		var status string
		err := pool.QueryRow(ctx, `SELECT status FROM idempotency_store WHERE idempotency_key = $1`, key).Scan(&status)
		if err == nil {
			return // cached or pending: not executed again
		}
		if err != pgx.ErrNoRows {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO idempotency_store (idempotency_key, status, expires_at) VALUES ($1, 'pending', now() + interval '1 day')`, key); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE idempotency_store SET status = 'completed', result = $2 WHERE idempotency_key = $1`, key, []byte(`{}`)); err != nil {
			b.Fatal(err)
		}
	}
	call("warmup")
	for i := 0; b.Loop(); i++ {
		call(residual.Key("bench", "task", "noop", "naive:"+strconv.Itoa(i)))
	}
}
