package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	promexp "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
)

// logFlags are --log-format and --log-level of the long-running commands (serve).
type logFlags struct {
	format string
	level  string
}

func addLogFlags(fl *pflag.FlagSet, f *logFlags) {
	fl.StringVar(&f.format, "log-format", "text", "log format on stderr: text or json")
	fl.StringVar(&f.level, "log-level", "warn", "least severe log level: debug, info, warn or error")
}

// logger returns the slog.Logger of --log-format and --log-level, writing to w.
func (f logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", f.format)
}

// metricsFlagHelp is the help of --metrics on long-running commands.
const metricsFlagHelp = "serve Prometheus metrics, unauthenticated, at http://ADDR/metrics (ADDR is host:port, e.g. 127.0.0.1:9464)"

// telemetry is what startTelemetry installed; Shutdown flushes and stops it.
type telemetry struct {
	shutdown []func(context.Context) error
	// metricsAddr is where /metrics listens, when --metrics was given.
	metricsAddr net.Addr
}

// Shutdown flushes the exporters and stops the /metrics server.
func (t *telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(t.shutdown) - 1; i >= 0; i-- {
		errs = append(errs, t.shutdown[i](ctx))
	}
	return errors.Join(errs...)
}

// otlpSet says whether any of the standard OTLP exporter variables names an endpoint for
// signal ("TRACES" or "METRICS").
func otlpSet(signal string) bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
}

// startTelemetry installs the OpenTelemetry SDK as the global providers when something is
// to be exported: a Prometheus /metrics endpoint at metricsAddr (when not empty), and OTLP
// over HTTP when OTEL_EXPORTER_OTLP_ENDPOINT (or the _TRACES_ / _METRICS_ variant) is set;
// the exporters read every other standard OTEL_EXPORTER_OTLP_* variable themselves. With
// neither, nothing is installed and the libraries stay on the no-op providers. It also
// registers the open-residual gauges of l and sets the W3C trace-context propagator.
func startTelemetry(ctx context.Context, metricsAddr string, l ledger.Ledger, log *slog.Logger) (*telemetry, error) {
	t := &telemetry{}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	for _, sig := range []string{"", "TRACES_", "METRICS_"} {
		if p := os.Getenv("OTEL_EXPORTER_OTLP_" + sig + "PROTOCOL"); p != "" && p != "http/protobuf" {
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_%sPROTOCOL=%s: toolfence exports OTLP over http/protobuf only", sig, p)
		}
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless())
	if err != nil {
		return nil, err
	}
	var readers []sdkmetric.Option
	if metricsAddr != "" {
		reg := prometheus.NewRegistry()
		exp, err := promexp.New(promexp.WithRegisterer(reg), promexp.WithoutScopeInfo())
		if err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		readers = append(readers, sdkmetric.WithReader(exp))
		ln, err := net.Listen("tcp", metricsAddr)
		if err != nil {
			return nil, usagef("--metrics %s: %v", metricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		t.metricsAddr = ln.Addr()
		t.shutdown = append(t.shutdown, srv.Shutdown)
	}
	if otlpSet("METRICS") {
		exp, err := otlpmetrichttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTLP metrics: %w", err)
		}
		readers = append(readers, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
	}
	if len(readers) > 0 {
		mp := sdkmetric.NewMeterProvider(append(readers, sdkmetric.WithResource(res))...)
		otel.SetMeterProvider(mp)
		t.shutdown = append(t.shutdown, mp.Shutdown)
		if _, err := interceptor.ObserveLedger(mp, l); err != nil {
			log.Warn("toolfence: no open-residual gauges", slog.String("error", err.Error()))
		}
	}
	if otlpSet("TRACES") {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTLP traces: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		otel.SetTracerProvider(tp)
		t.shutdown = append(t.shutdown, tp.Shutdown)
	}
	return t, nil
}

// metricsServing tells where /metrics listens.
func metricsServing(w io.Writer, t *telemetry) {
	if t.metricsAddr != nil {
		fmt.Fprintf(w, "toolfence: serving metrics at http://%s/metrics\n", strings.TrimSpace(t.metricsAddr.String()))
	}
}
