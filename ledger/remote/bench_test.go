package remote_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/ledger/remote"
	"github.com/toolfence/toolfence/residual"
)

// benchLedgers returns the badger ledger itself ("direct") and a Client of it over a unix
// socket ("socket": what a guest of a shared store uses), on a fresh store.
func benchLedgers(b *testing.B) map[string]ledger.Ledger {
	b.Helper()
	dir := shortDirB(b)
	l, err := badger.Open(dir, badger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	endpoint := serveB(b, remote.Handler(l, remote.HandlerOptions{Authorize: remote.AllNamespaces()}), dir)
	c, err := remote.New(endpoint, remote.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return map[string]ledger.Ledger{"direct": l, "socket": c}
}

func noopTool(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
	return interceptor.Response{Status: 200, Body: []byte(`{"ok":true}`)}, nil
}

// BenchmarkGuardedCall: interceptor.Do (no-op tool, distinct keys: reserve and commit, both
// durable) on the badger ledger directly and through the ledger protocol over a unix
// socket, sequentially and from ~64 goroutines.
func BenchmarkGuardedCall(b *testing.B) {
	for _, par := range []bool{false, true} {
		for _, name := range []string{"direct", "socket"} {
			sub := name
			if par {
				sub += "-parallel"
			}
			b.Run(sub, func(b *testing.B) {
				ic, err := interceptor.New(benchLedgers(b)[name], interceptor.Options{Holder: "bench"})
				if err != nil {
					b.Fatal(err)
				}
				ctx := interceptor.WithTask(context.Background(), "bench")
				var next atomic.Int64
				call := func() {
					target := strconv.FormatInt(next.Add(1), 10)
					res, err := ic.Do(ctx, interceptor.Call{Operation: "noop", Target: target}, noopTool)
					if err != nil || res.Replayed {
						b.Errorf("call %s: %v", target, err)
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				if !par {
					for b.Loop() {
						call()
					}
					return
				}
				b.SetParallelism(32)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						call()
					}
				})
			})
		}
	}
}

// BenchmarkGuardedCallAB alternates a guarded call on the badger ledger directly and one
// through the socket (separate stores, same disk), so both see the same noise, and reports
// each one's mean (direct-µs/op, socket-µs/op) and their ratio.
func BenchmarkGuardedCallAB(b *testing.B) {
	direct := benchLedgers(b)["direct"]
	socket := benchLedgers(b)["socket"]
	var ics []*interceptor.Interceptor
	for _, l := range []ledger.Ledger{direct, socket} {
		ic, err := interceptor.New(l, interceptor.Options{Holder: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		ics = append(ics, ic)
	}
	ctx := interceptor.WithTask(context.Background(), "bench")
	var spent [2]time.Duration
	n := 0
	for i := 0; b.Loop(); i++ {
		for j, ic := range ics {
			start := time.Now()
			if _, err := ic.Do(ctx, interceptor.Call{Operation: "noop", Target: strconv.Itoa(i)}, noopTool); err != nil {
				b.Fatal(err)
			}
			spent[j] += time.Since(start)
		}
		n++
	}
	b.ReportMetric(float64(spent[0].Microseconds())/float64(n), "direct-µs/op")
	b.ReportMetric(float64(spent[1].Microseconds())/float64(n), "socket-µs/op")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "socket/direct")
}

// BenchmarkGetAB alternates a Get of one residual on the badger ledger directly and through
// the socket: the protocol's own cost per request, without a sync.
func BenchmarkGetAB(b *testing.B) {
	ls := benchLedgers(b)
	ctx := context.Background()
	p := ledger.ReserveParams{Namespace: "ns", Key: residual.Key("ns", "t", "o", "x"), Task: "t", Operation: "o", Target: "x", Holder: "h", RequestDigest: "d", TTL: time.Hour}
	if _, err := ls["direct"].Reserve(ctx, p); err != nil {
		b.Fatal(err)
	}
	var spent [2]time.Duration
	n := 0
	for b.Loop() {
		for j, name := range []string{"direct", "socket"} {
			start := time.Now()
			if _, err := ls[name].Get(ctx, ledger.GetParams{Namespace: "ns", Key: p.Key}); err != nil {
				b.Fatal(err)
			}
			spent[j] += time.Since(start)
		}
		n++
	}
	b.ReportMetric(float64(spent[0].Nanoseconds())/1e3/float64(n), "direct-µs/op")
	b.ReportMetric(float64(spent[1].Nanoseconds())/1e3/float64(n), "socket-µs/op")
}

// shortDirB is shortDir for benchmarks.
func shortDirB(b *testing.B) string {
	b.Helper()
	dir, err := os.MkdirTemp("", "tfb")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// serveB serves h on a unix socket in dir and returns its endpoint.
func serveB(b *testing.B, h http.Handler, dir string) string {
	b.Helper()
	sock := filepath.Join(dir, "bench.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	return "unix:" + sock
}
