package interceptor

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// TestTelemetryOff pins which providers switch telemetry off: OpenTelemetry's no-op
// providers and the global delegates before a program installs a provider (named by their
// type, so an OpenTelemetry upgrade that renames them fails here rather than silently
// recording nothing), never an SDK provider.
func TestTelemetryOff(t *testing.T) {
	for name, c := range map[string]struct {
		p            any
		noop, global bool
	}{
		"trace noop":          {p: tracenoop.NewTracerProvider(), noop: true},
		"metric noop":         {p: metricnoop.NewMeterProvider(), noop: true},
		"global trace unset":  {p: otel.GetTracerProvider(), global: true},
		"global metric unset": {p: otel.GetMeterProvider(), global: true},
		"trace SDK":           {p: sdktrace.NewTracerProvider()},
		"metric SDK":          {p: sdkmetric.NewMeterProvider()},
	} {
		if got := isNoop(c.p); got != c.noop {
			t.Errorf("%s (%T): isNoop = %v, want %v", name, c.p, got, c.noop)
		}
		if got := isGlobalDelegate(c.p); got != c.global {
			t.Errorf("%s (%T): isGlobalDelegate = %v, want %v", name, c.p, got, c.global)
		}
	}
}

// TestOffTelemetryAllocatesNothing: with no provider, a ledger step and a counted call make
// no allocation at all (the span, its context, the attribute set and the closure are all
// skipped), which is what keeps the uninstrumented cost of the barrier at a branch.
func TestOffTelemetryAllocatesNothing(t *testing.T) {
	for name, opts := range map[string]Options{
		"no-op providers": {TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: metricnoop.NewMeterProvider()},
		"none installed":  {TracerProvider: otel.GetTracerProvider(), MeterProvider: otel.GetMeterProvider()},
	} {
		tel, err := newTelemetry(opts, nil)
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
			t.Errorf("%s: telemetry without a provider allocated %.0f times per step, want 0", name, allocs)
		}
	}
}

// TestProviderInstalledAfterNew: an interceptor made while the global providers are still
// the delegates records once the program installs an SDK (OpenTelemetry lets a program
// install its providers late). The test leaves the no-op providers installed, which keeps
// telemetry off for the other tests of the package, as the delegates did.
func TestProviderInstalledAfterNew(t *testing.T) {
	tel, err := newTelemetry(Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !tel.tracesOff() || !tel.metricsOff() {
		t.Fatal("telemetry is on before any provider was installed")
	}
	exp := tracetest.NewInMemoryExporter()
	reader := sdkmetric.NewManualReader()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	t.Cleanup(func() {
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
	})
	_, end := tel.step(context.Background(), "reserve")
	end(nil)
	tel.countCall(context.Background(), "charge", resultExecuted, "succeeded")
	if n := len(exp.GetSpans()); n != 1 {
		t.Errorf("spans after the provider was installed: %d, want 1", n)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			names[m.Name] = true
		}
	}
	if !names["toolfence.calls"] || !names["toolfence.ledger.step.duration"] {
		t.Errorf("metrics after the provider was installed: %v, want toolfence.calls and toolfence.ledger.step.duration", names)
	}
}
