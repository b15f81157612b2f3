package badger

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/ledgertest"
	"github.com/toolfence/toolfence/residual"
)

func benchParams(i uint64) ledger.ReserveParams {
	target := fmt.Sprint("bench-", i)
	return ledger.ReserveParams{
		Namespace: "bench", Key: residual.Key("bench", "task", "op", target), Task: "task",
		Operation: "op", Target: target, Holder: "agent", RequestDigest: "digest", TTL: time.Minute,
	}
}

// reserveCommit runs one guarded call's two durable steps on a fresh key.
func reserveCommit(b *testing.B, l *Ledger, i uint64) error {
	p := benchParams(i)
	res, err := l.Reserve(b.Context(), p)
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	if res.Decision != ledger.Acquired {
		return fmt.Errorf("reserve decided %s", res.Decision)
	}
	_, err = l.Commit(b.Context(), ledger.CommitParams{
		Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
		Outcome: residual.Succeeded, Result: []byte(`{"ok":true}`), Margin: time.Millisecond,
	})
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

func openBench(b *testing.B, opts Options) *Ledger {
	l, err := Open(b.TempDir(), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	return l
}

// BenchmarkReserveCommit is one caller doing reserve+commit on distinct keys: two synced
// steps per op, nothing to share a sync with.
func BenchmarkReserveCommit(b *testing.B) {
	for _, mode := range modes {
		b.Run(mode.String(), func(b *testing.B) {
			l := openBench(b, Options{Sync: mode})
			var i uint64
			for b.Loop() {
				i++
				if err := reserveCommit(b, l, i); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReserveCommitParallel is 32×GOMAXPROCS callers doing reserve+commit on distinct
// keys: group commit shares one sync among all steps waiting at the time.
func BenchmarkReserveCommitParallel(b *testing.B) {
	for _, mode := range modes {
		b.Run(mode.String(), func(b *testing.B) {
			l := openBench(b, Options{Sync: mode})
			var next atomic.Uint64
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := reserveCommit(b, l, next.Add(1)); err != nil {
						b.Error(err) // Fatal is not allowed off the benchmark goroutine
						return
					}
				}
			})
			b.StopTimer()
			l.gs.mu.Lock()
			rounds := l.gs.rounds
			l.gs.mu.Unlock()
			// Group commit: DB.Sync rounds per op (each op is two steps). SyncWrites: the
			// directory-check rounds; badger itself msyncs once per step there.
			b.ReportMetric(float64(rounds)/float64(b.N), "rounds/op")
		})
	}
}

// BenchmarkReplay is Reserve on a succeeded key with the same request digest: served from
// the replay cache, or with the cache off from a read-only transaction and a JSON decode.
func BenchmarkReplay(b *testing.B) {
	for _, c := range []struct {
		name  string
		bytes int64
	}{{"cache", 0}, {"no-cache", -1}} {
		b.Run(c.name, func(b *testing.B) {
			l := openBench(b, Options{ReplayCacheBytes: c.bytes})
			if err := reserveCommit(b, l, 0); err != nil {
				b.Fatal(err)
			}
			p := benchParams(0)
			b.ReportAllocs()
			for b.Loop() {
				res, err := l.Reserve(b.Context(), p)
				if err != nil || res.Decision != ledger.Replay {
					b.Fatalf("%v %+v", err, res)
				}
			}
		})
	}
}

// failedCycle is one begin → failed commit cycle on p's key: attempts pile up on
// one key, and a residual keeps only its first and latest 16.
func failedCycle(b *testing.B, l ledger.Ledger, p ledger.ReserveParams) {
	res, err := l.Reserve(b.Context(), p)
	if err != nil || res.Decision != ledger.Acquired {
		b.Fatalf("reserve: %v %v", res, err)
	}
	if _, err := l.Commit(b.Context(), ledger.CommitParams{
		Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
		Outcome: residual.Failed, Error: "upstream said no", Margin: time.Millisecond,
	}); err != nil {
		b.Fatalf("commit: %v", err)
	}
}

// BenchmarkCycle600 times the begin → failed commit cycles of one key from the 600th on
// (599 cycles before them are untimed, once): what a key that keeps failing costs once
// attempts pile up. A residual keeps its first and latest 16 attempts, so every timed
// cycle meets the same history.
func BenchmarkCycle600(b *testing.B) {
	l := openBench(b, Options{})
	p := benchParams(1)
	for range 599 {
		failedCycle(b, l, p)
	}
	for b.Loop() {
		failedCycle(b, l, p)
	}
}

// fillSettled writes n succeeded residuals to namespace "bench" directly (in transactions
// of 500, without the per-step sync), spread over 100 tasks, 10 operations and n targets,
// and one live pending residual (task "task-open"): a namespace of many settled residuals
// with little left open, as a long-running agent fleet leaves it.
func fillSettled(b *testing.B, l *Ledger, n int) {
	now := l.now()
	for start := 0; start < n; start += 500 {
		err := l.update(b.Context(), "fill", func(t *tx, _ time.Time) (bool, error) {
			for i := start; i < min(start+500, n); i++ {
				task, op, target := fmt.Sprint("task-", i%100), fmt.Sprint("op-", i%10), fmt.Sprint("item:", i)
				r := &residual.Residual{
					Key: residual.Key("bench", task, op, target), Namespace: "bench", Task: task,
					Operation: op, Target: target, State: residual.Succeeded, RequestDigest: "d", Token: 1,
					Attempts: []residual.Attempt{{N: 1, Holder: "agent", Token: 1, LeaseExpires: now.Add(time.Minute),
						Started: now, Ended: now, RequestDigest: "d", Outcome: residual.Succeeded, Released: true}},
					AttemptCount: 1, Result: []byte(`{"ok":true}`), CreatedAt: now, UpdatedAt: now,
				}
				if err := putResidual(t, r); err != nil {
					return false, err
				}
			}
			return true, nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	p := benchParams(0)
	p.Task = "task-open"
	p.Key = residual.Key(p.Namespace, p.Task, p.Operation, p.Target)
	p.TTL = time.Hour
	if res, err := l.Reserve(b.Context(), p); err != nil || res.Decision != ledger.Acquired {
		b.Fatalf("reserve: %v %v", res, err)
	}
}

// BenchmarkListFiltered lists one page of a namespace of 20,000 settled residuals with the
// filters of list_pending (the open states): a task that matches nothing, and no field
// filter at all (one open residual among 20,000 settled ones). Checked in memory, both
// would read every residual of the namespace; the filter index must make them cheap.
func BenchmarkListFiltered(b *testing.B) {
	l := openBench(b, Options{})
	fillSettled(b, l, 20_000)
	ledgertest.BenchListFiltered(b, l, "bench")
}
