package interceptor_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sys/unix"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
)

// Targets of the barrier on badger (docs/benchmarks.md), each a ratio within one run:
//   GuardedCall ≤ 1.5 × (2 × FsyncFloor): a guarded call is two durable commits;
//   GuardedCallParallelSyncWrites ≥ 2 × GuardedCallParallel: group commit must coalesce;
//   Replay ≤ 10 µs/op.

// benchStore opens a real badger ledger (real clock) in a fresh temp dir and returns it with
// the directory, so the fsync floor is measured on the same file system.
func benchStore(b *testing.B, mode badger.SyncMode) (*badger.Ledger, string) {
	b.Helper()
	dir := b.TempDir()
	l, err := badger.Open(dir, badger.Options{Sync: mode})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	return l, dir
}

func benchInterceptor(b *testing.B, mode badger.SyncMode) *interceptor.Interceptor {
	b.Helper()
	l, _ := benchStore(b, mode)
	ic, err := interceptor.New(l, interceptor.Options{Holder: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	return ic
}

func noopTool(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
	return interceptor.Response{Status: 200, Body: []byte(`{"ok":true}`)}, nil
}

// BenchmarkFsyncFloor is the cost of one durable write on this disk: overwrite one
// preallocated 4 KiB block and fdatasync it, in the ledger's own directory.
func BenchmarkFsyncFloor(b *testing.B) {
	_, dir := benchStore(b, badger.GroupCommit)
	fd, err := os.OpenFile(filepath.Join(dir, "fsync-floor"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer fd.Close()
	block := make([]byte, 4096)
	if _, err := fd.WriteAt(block, 0); err != nil {
		b.Fatal(err)
	}
	if err := fd.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		block[0] = byte(i)
		if _, err := unix.Pwrite(int(fd.Fd()), block, 0); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fdatasync(int(fd.Fd())); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGuardedCall runs one guarded call after another (no-op tool, distinct keys) on
// the embedded ledger with group commit: reserve and commit, each durable.
func BenchmarkGuardedCall(b *testing.B) { benchTelemetry(b, nil, nil) }

func benchParallel(b *testing.B, mode badger.SyncMode) {
	ic := benchInterceptor(b, mode)
	ctx := interceptor.WithTask(context.Background(), "bench")
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32) // 32 × GOMAXPROCS: ~64 goroutines on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			target := strconv.FormatInt(next.Add(1), 10)
			res, err := ic.Do(ctx, interceptor.Call{Operation: "noop", Target: target}, noopTool)
			if err != nil || res.Replayed {
				b.Errorf("call %s: %v %+v", target, err, res)
				return
			}
		}
	})
}

// BenchmarkGuardedCallParallel runs ~64 concurrent guarded calls on distinct keys with group
// commit: concurrent ledger steps share syncs.
func BenchmarkGuardedCallParallel(b *testing.B) { benchParallel(b, badger.GroupCommit) }

// BenchmarkGuardedCallParallelSyncWrites is the same load with group commit off: badger
// SyncWrites, one synced transaction per ledger step.
func BenchmarkGuardedCallParallelSyncWrites(b *testing.B) { benchParallel(b, badger.SyncWrites) }

// BenchmarkReplay repeats a call whose key already succeeded: no dispatch, no write.
func BenchmarkReplay(b *testing.B) {
	ic := benchInterceptor(b, badger.GroupCommit)
	ctx := interceptor.WithTask(context.Background(), "bench")
	call := interceptor.Call{Operation: "payments.charge", Target: "invoice:INV-42", Args: []byte(`{"amount":1200,"currency":"eur"}`)}
	if _, err := ic.Do(ctx, call, noopTool); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		res, err := ic.Do(ctx, call, noopTool)
		if err != nil || !res.Replayed {
			b.Fatalf("%v %+v", err, res)
		}
	}
}

// benchTelemetry runs guarded calls one after another (no-op tool, distinct keys) with the
// given telemetry providers on the interceptor (nil: the global ones, no-op by default).
func benchTelemetry(b *testing.B, tp trace.TracerProvider, mp metric.MeterProvider) {
	l, _ := benchStore(b, badger.GroupCommit)
	ic, err := interceptor.New(l, interceptor.Options{Holder: "bench", TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		b.Fatal(err)
	}
	ctx := interceptor.WithTask(context.Background(), "bench")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		res, err := ic.Do(ctx, interceptor.Call{Operation: "noop", Target: strconv.Itoa(i)}, noopTool)
		if err != nil || res.Replayed {
			b.Fatalf("call %d: %v %+v", i, err, res)
		}
	}
}

// BenchmarkGuardedCallNoopTelemetry is BenchmarkGuardedCall with the OpenTelemetry no-op
// providers set explicitly (BenchmarkGuardedCall uses the global ones, no-op too).
func BenchmarkGuardedCallNoopTelemetry(b *testing.B) {
	benchTelemetry(b, tracenoop.NewTracerProvider(), metricnoop.NewMeterProvider())
}

// BenchmarkGuardedCallSDKTelemetry is BenchmarkGuardedCall with the OpenTelemetry SDK: every
// span recorded into an in-memory exporter (reset every 4096 calls), metrics aggregated by a
// manual reader.
func BenchmarkGuardedCallSDKTelemetry(b *testing.B) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(&resetting{InMemoryExporter: exp}))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	benchTelemetry(b, tp, mp)
}

// resetting keeps the in-memory exporter from growing without bound over a long benchmark.
// It counts spans itself: GetSpans copies every span held.
type resetting struct {
	*tracetest.InMemoryExporter
	n atomic.Int64
}

func (r *resetting) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if r.n.Add(int64(len(spans))) > 4096 {
		r.Reset()
		r.n.Store(int64(len(spans)))
	}
	return r.InMemoryExporter.ExportSpans(ctx, spans)
}
