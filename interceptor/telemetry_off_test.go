package interceptor

import (
	"testing"

	"go.opentelemetry.io/otel"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// TestIsNoop pins which providers switch telemetry off: OpenTelemetry's no-op providers and
// the global delegates before a program installs a provider (named by their type, so an
// OpenTelemetry upgrade that renames them fails here rather than silently recording or
// silently dropping), never an SDK provider.
func TestIsNoop(t *testing.T) {
	for name, c := range map[string]struct {
		p    any
		want bool
	}{
		"trace noop":          {tracenoop.NewTracerProvider(), true},
		"metric noop":         {metricnoop.NewMeterProvider(), true},
		"global trace unset":  {otel.GetTracerProvider(), true},
		"global metric unset": {otel.GetMeterProvider(), true},
		"trace SDK":           {sdktrace.NewTracerProvider(), false},
		"metric SDK":          {sdkmetric.NewMeterProvider(), false},
	} {
		if got := isNoop(c.p); got != c.want {
			t.Errorf("%s (%T): isNoop = %v, want %v", name, c.p, got, c.want)
		}
	}
}

// TestOffTelemetryAllocatesNothing: with no provider, a ledger step and a counted call make
// no allocation at all (the span, its context, the attribute set and the closure are all
// skipped), which is what keeps the uninstrumented cost of the barrier at a branch.
func TestOffTelemetryAllocatesNothing(t *testing.T) {
	tel, err := newTelemetry(Options{TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: metricnoop.NewMeterProvider()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	allocs := testing.AllocsPerRun(100, func() {
		sctx, end := tel.step(ctx, "reserve")
		tel.countCall(sctx, "charge", resultExecuted, "succeeded")
		tel.renewed(sctx, nil)
		end(nil)
	})
	if allocs != 0 {
		t.Fatalf("telemetry without a provider allocated %.0f times per step, want 0", allocs)
	}
}
