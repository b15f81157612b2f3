package mcpproxy

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
)

// TestSpansAreSkippedWhileTracesAreOff: with a no-op TracerProvider the proxy starts no span
// and allocates nothing for one (as the interceptor skips its own, Interceptor.TracesOff);
// with an SDK provider its spans are recorded.
func TestSpansAreSkippedWhileTracesAreOff(t *testing.T) { // not parallel: AllocsPerRun
	l, err := badger.Open(filepath.Join(t.TempDir(), "store"), badger.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	id, err := jsonrpc.MakeID(float64(1))
	require.NoError(t, err)
	params := callParams{Name: "charge"}

	proxy := func(tp trace.TracerProvider) *Proxy {
		ic, err := interceptor.New(l, interceptor.Options{TracerProvider: tp})
		require.NoError(t, err)
		p, err := New(ic, Options{ServerID: "fx"})
		require.NoError(t, err)
		return p
	}

	off := proxy(tracenoop.NewTracerProvider())
	require.True(t, off.ic.TracesOff())
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		cctx, span := off.startCall(ctx, id, params)
		_, inner := off.startSpan(cctx, "execute_tool fx/charge")
		inner.End()
		span.End()
	})
	require.Zero(t, allocs)
	_, span := off.startCall(ctx, id, params)
	require.False(t, span.IsRecording())

	rec := tracetest.NewSpanRecorder()
	on := proxy(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	require.False(t, on.ic.TracesOff())
	cctx, span := on.startCall(ctx, id, params)
	_, inner := on.startSpan(cctx, "execute_tool fx/charge")
	require.True(t, span.IsRecording())
	inner.End()
	span.End()
	require.Len(t, rec.Ended(), 2)
}
