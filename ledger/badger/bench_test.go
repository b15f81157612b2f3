package badger

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolfence/toolfence/ledger"
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

// failedCycle is one begin → failed commit cycle on p's key (issue 14 item 5).
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

// BenchmarkCycle600 times the 600th begin → failed commit cycle on one key (599 cycles
// before it are untimed): what a key that keeps failing costs once attempts pile up.
func BenchmarkCycle600(b *testing.B) {
	l := openBench(b, Options{})
	var i uint64
	for b.Loop() {
		b.StopTimer()
		i++
		p := benchParams(i)
		for range 599 {
			failedCycle(b, l, p)
		}
		b.StartTimer()
		failedCycle(b, l, p)
	}
}
