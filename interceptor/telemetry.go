package interceptor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// ScopeName is the instrumentation scope of toolfence's spans and metrics.
const ScopeName = "github.com/toolfence/toolfence"

// MaxOperationLabels caps the distinct operation names that get their own value of the
// "operation" metric attribute; later names are counted under "_other", so a client that
// invents tool names cannot blow up the metrics' cardinality.
const MaxOperationLabels = 100

// Span attribute keys. The gen_ai.* and db.* ones follow the OpenTelemetry semantic
// conventions; toolfence.* are toolfence's own. No span ever carries arguments or results.
const (
	AttrOperationName = attribute.Key("gen_ai.operation.name")
	AttrToolName      = attribute.Key("gen_ai.tool.name")
	AttrToolCallID    = attribute.Key("gen_ai.tool.call.id")
	AttrKey           = attribute.Key("toolfence.key")
	AttrTask          = attribute.Key("toolfence.task")
	AttrNamespace     = attribute.Key("toolfence.namespace")
	AttrAttempt       = attribute.Key("toolfence.attempt")
	AttrToken         = attribute.Key("toolfence.fencing_token")
	AttrDecision      = attribute.Key("toolfence.decision")
	AttrOutcome       = attribute.Key("toolfence.outcome")
	AttrViolation     = attribute.Key("toolfence.violation")
	AttrReplayed      = attribute.Key("toolfence.replayed")
	AttrErrorType     = attribute.Key("error.type")
	AttrDBSystem      = attribute.Key("db.system.name")
	AttrDBOperation   = attribute.Key("db.operation.name")
	AttrDBCollection  = attribute.Key("db.collection.name")
	AttrDBNamespace   = attribute.Key("db.namespace")
)

// Call results, the "result" attribute of toolfence.calls.
const (
	resultExecuted = "executed"
	resultReplayed = "replayed"
	resultRefused  = "refused"
	resultError    = "error"
)

// telemetry holds the interceptor's tracer, instruments and logger. Interceptors made by
// ForNamespace share one.
type telemetry struct {
	tracer trace.Tracer
	// traceNoop and meterNoop are set for OpenTelemetry's no-op providers; traceGlobal and
	// meterGlobal hold the global delegates when the providers were the globals and none was
	// installed yet. While either holds (see tracesOff, metricsOff) every record is skipped
	// before any attribute, span or closure is made, so an uninstrumented program pays a
	// branch; a provider installed later is picked up by the next call.
	traceNoop, meterNoop bool
	traceGlobal          trace.TracerProvider
	meterGlobal          metric.MeterProvider
	log                  *slog.Logger
	db                   ledger.Description
	dbAttrs              []attribute.KeyValue
	kind                 trace.SpanKind

	calls, renewals, fenceRefusals, reconciled metric.Int64Counter
	callDuration, stepDuration                 metric.Float64Histogram

	opsMu sync.RWMutex
	ops   map[string]struct{}
	sets  sync.Map // labels → metric.MeasurementOption
}

func newTelemetry(cfg Options, l ledger.Ledger) (*telemetry, error) {
	tp, mp := cfg.TracerProvider, cfg.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &telemetry{tracer: tp.Tracer(ScopeName), log: cfg.Logger, ops: map[string]struct{}{}, kind: trace.SpanKindInternal,
		traceNoop: isNoop(tp), meterNoop: isNoop(mp)}
	if isGlobalDelegate(tp) {
		t.traceGlobal = tp
	}
	if isGlobalDelegate(mp) {
		t.meterGlobal = mp
	}
	if d, ok := l.(ledger.Describer); ok {
		t.db = d.Describe()
	}
	if t.db.System != "" {
		t.dbAttrs = append(t.dbAttrs, AttrDBSystem.String(t.db.System))
		if t.db.Remote {
			t.kind = trace.SpanKindClient
		}
	}
	if t.db.Namespace != "" {
		t.dbAttrs = append(t.dbAttrs, AttrDBNamespace.String(t.db.Namespace))
	}
	if t.db.Collection != "" {
		t.dbAttrs = append(t.dbAttrs, AttrDBCollection.String(t.db.Collection))
	}
	m := mp.Meter(ScopeName)
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string, bounds ...float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(bounds...))
		errs = append(errs, err)
		return h
	}
	t.calls = counter("toolfence.calls", "{call}", "Guarded calls by operation, result (executed, replayed, refused, error) and reason (the recorded outcome, the violation kind or the error).")
	t.renewals = counter("toolfence.lease.renewals", "{renewal}", "Lease renewals by result (ok, lease_lost, error).")
	t.fenceRefusals = counter("toolfence.fence.refusals", "{refusal}", "Writes the fence refused because the lease was lost (step: commit, renew, resume).")
	t.reconciled = counter("toolfence.reconcile.residuals", "{residual}", "Residuals a reconcile looked at, by result (succeeded, failed: settled by a probe; open: left open).")
	t.callDuration = histogram("toolfence.call.duration", "Duration of a guarded call (Interceptor.Do) from the reservation to the commit, by operation and result.",
		0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
	t.stepDuration = histogram("toolfence.ledger.step.duration", "Duration of one ledger step (reserve, commit, renew, resolve), by step and error.type.",
		0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return t, nil
}

// isNoop says p (a TracerProvider or MeterProvider) is one of OpenTelemetry's no-op providers.
func isNoop(p any) bool {
	switch p.(type) {
	case tracenoop.TracerProvider, *tracenoop.TracerProvider, metricnoop.MeterProvider, *metricnoop.MeterProvider:
		return true
	}
	return false
}

// isGlobalDelegate says p is OpenTelemetry's global delegate as it is before a program
// installs a provider (named by its type: TestTelemetryOff pins it, so an OpenTelemetry
// upgrade that renames it fails there instead of silently recording nothing).
func isGlobalDelegate(p any) bool {
	switch reflect.TypeOf(p).String() {
	case "*global.tracerProvider", "*global.meterProvider":
		return true
	}
	return false
}

// tracesOff says no span would be recorded: a no-op provider, or the global one while no
// provider has been installed (an atomic load and a comparison).
func (t *telemetry) tracesOff() bool {
	return t.traceNoop || (t.traceGlobal != nil && otel.GetTracerProvider() == t.traceGlobal)
}

// metricsOff is tracesOff for the metrics.
func (t *telemetry) metricsOff() bool {
	return t.meterNoop || (t.meterGlobal != nil && otel.GetMeterProvider() == t.meterGlobal)
}

// start starts a span, or returns ctx and the no-op span without allocating while traces
// are off.
func (t *telemetry) start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t.tracesOff() {
		return ctx, offSpan
	}
	return t.tracer.Start(ctx, name, opts...)
}

var offSpan = trace.SpanFromContext(context.Background())

// noEnd ends a step that records nothing.
func noEnd(error) {}

// opLabel is the operation's metric label: its name for the first MaxOperationLabels names,
// "_other" after that.
func (t *telemetry) opLabel(op string) string {
	t.opsMu.RLock()
	_, ok := t.ops[op]
	t.opsMu.RUnlock()
	if ok {
		return op
	}
	t.opsMu.Lock()
	defer t.opsMu.Unlock()
	if _, ok := t.ops[op]; ok {
		return op
	}
	if len(t.ops) >= MaxOperationLabels {
		return "_other"
	}
	t.ops[op] = struct{}{}
	return op
}

type labels struct{ a, b, c, d string }

// attrs returns the measurement option of a label set, built once per distinct set.
func (t *telemetry) attrs(l labels, kv func() []attribute.KeyValue) metric.MeasurementOption {
	if o, ok := t.sets.Load(l); ok {
		return o.(metric.MeasurementOption)
	}
	o := metric.WithAttributeSet(attribute.NewSet(kv()...))
	t.sets.Store(l, o)
	return o
}

// countCall adds one call to toolfence.calls.
func (t *telemetry) countCall(ctx context.Context, op, result, reason string) {
	if t.metricsOff() {
		return
	}
	op = t.opLabel(op)
	t.calls.Add(ctx, 1, t.attrs(labels{"calls", op, result, reason}, func() []attribute.KeyValue {
		return []attribute.KeyValue{attribute.String("operation", op), attribute.String("result", result), attribute.String("reason", reason)}
	}))
}

// step starts the span of one ledger step and returns the context for the ledger and the
// function that ends the span and records the step's duration.
func (t *telemetry) step(ctx context.Context, name string) (context.Context, func(error)) {
	if t.tracesOff() && t.metricsOff() {
		return ctx, noEnd
	}
	start := time.Now()
	ctx, span := t.start(ctx, t.stepName(name), trace.WithSpanKind(t.kind))
	if span.IsRecording() {
		span.SetAttributes(t.dbAttrs...)
		span.SetAttributes(AttrDBOperation.String(name))
	}
	return ctx, func(err error) {
		et := ""
		if err != nil {
			et = errorType(err)
			span.SetAttributes(AttrErrorType.String(et))
			span.SetStatus(codes.Error, et)
		}
		span.End()
		if t.metricsOff() {
			return
		}
		t.stepDuration.Record(ctx, time.Since(start).Seconds(), t.attrs(labels{"step", name, et, ""}, func() []attribute.KeyValue {
			kv := []attribute.KeyValue{attribute.String("step", name), AttrDBSystem.String(t.db.System)}
			if et != "" {
				kv = append(kv, AttrErrorType.String(et))
			}
			return kv
		}))
	}
}

// stepName is the span name of a ledger step: "{operation} {collection}" as the database
// conventions name client spans, or the operation alone.
func (t *telemetry) stepName(op string) string {
	if t.db.Collection == "" {
		return op
	}
	return op + " " + t.db.Collection
}

// errorType is the error.type of an error: the violation kind or the residual sentinel it
// wraps, a refusal of the call, or "ledger_error".
func errorType(err error) string {
	var v *Violation
	if errors.As(err, &v) {
		return string(v.Kind)
	}
	for _, c := range []struct {
		err  error
		name string
	}{
		{residual.ErrLeaseLost, string(LeaseLost)},
		{residual.ErrInProgress, string(InProgress)},
		{residual.ErrNotFound, "not_found"},
		{residual.ErrInvalidTransition, "invalid_transition"},
		{residual.ErrTokenChanged, "token_changed"},
		{ErrNoTask, "no_task"},
		{ErrInvalidCall, "invalid_call"},
		{ErrArgsTooLarge, "args_too_large"},
		{ErrNotDispatched, "not_dispatched"},
		{ErrCallFailed, "call_failed"},
		{context.Canceled, "canceled"},
		{context.DeadlineExceeded, "deadline_exceeded"},
	} {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return "ledger_error"
}

// annotateCall sets the call's identity on the span in ctx (the execute_tool span of Do,
// or the span of the surface's request).
func annotateCall(ctx context.Context, ns, task string, call Call) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrOperationName.String("execute_tool"), AttrToolName.String(call.Operation),
		AttrTask.String(task), AttrNamespace.String(ns))
	if call.CallID != "" {
		span.SetAttributes(AttrToolCallID.String(call.CallID))
	}
}

// annotateAttempt sets the key, attempt and token of a reservation's decision.
func annotateAttempt(ctx context.Context, key string, attempt int, token uint64, decision string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrKey.String(key), AttrDecision.String(decision))
	if attempt > 0 {
		span.SetAttributes(AttrAttempt.Int(attempt), AttrToken.Int64(int64(token)))
	}
}

// settle records how a call ended: on the span in ctx (outcome, replayed, violation kind,
// error.type and status), in toolfence.calls, and in one log line for a refused or
// ambiguous call. result is resultExecuted (the call was dispatched), resultReplayed,
// resultRefused or resultError; the reason is derived from res and err.
func (t *telemetry) settle(ctx context.Context, op, result string, res *Result, err error) {
	var v *Violation
	errors.As(err, &v)
	reason := ""
	switch {
	case result == resultReplayed:
	case result == resultExecuted && v != nil:
		reason = map[Kind]string{LeaseLost: string(LeaseLost), AwaitingUpstream: residual.Accepted.String()}[v.Kind]
		if reason == "" {
			reason = residual.Unknown.String()
		}
	case result == resultExecuted && res != nil:
		reason = res.State.String()
	case v != nil:
		reason = string(v.Kind)
	case err != nil:
		reason = errorType(err)
	}
	t.countCall(ctx, op, result, reason)

	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		span.SetAttributes(AttrReplayed.Bool(result == resultReplayed))
		if res != nil {
			span.SetAttributes(AttrKey.String(res.Key), AttrOutcome.String(res.State.String()))
			if res.Attempt > 0 {
				span.SetAttributes(AttrAttempt.Int(res.Attempt), AttrToken.Int64(int64(res.Token)))
			}
		}
		if v != nil {
			span.SetAttributes(AttrViolation.String(string(v.Kind)), AttrKey.String(v.Key))
			if result == resultExecuted {
				span.SetAttributes(AttrOutcome.String(reason))
			} else if v.State != "" {
				span.SetAttributes(AttrOutcome.String(v.State.String()))
			}
		}
		if err != nil {
			et := errorType(err)
			span.SetAttributes(AttrErrorType.String(et))
			span.SetStatus(codes.Error, et)
		}
	}
	if t.log == nil {
		return
	}
	switch {
	case v != nil:
		level := slog.LevelInfo
		if v.Kind == UnknownOutcome || v.Kind == LeaseLost || v.Kind == PayloadMismatch {
			level = slog.LevelWarn
		}
		if t.log.Enabled(ctx, level) {
			t.log.LogAttrs(ctx, level, "toolfence: call "+result, slog.String("kind", string(v.Kind)),
				slog.String("key", v.Key), slog.String("operation", v.Operation), slog.String("state", v.State.String()),
				slog.Int("attempt", v.Attempt), slog.String("recovery", v.Recovery))
		}
	case result == resultError && t.log.Enabled(ctx, slog.LevelWarn):
		t.log.LogAttrs(ctx, slog.LevelWarn, "toolfence: call not dispatched", slog.String("operation", op),
			slog.String("error.type", reason))
	}
}

// renewed counts one lease renewal by its result, and a fence refusal when it was refused.
func (t *telemetry) renewed(ctx context.Context, err error) {
	result := "ok"
	switch {
	case errors.Is(err, residual.ErrLeaseLost):
		result = string(LeaseLost)
		t.refused(ctx, "renew")
	case err != nil:
		result = "error"
	}
	if t.metricsOff() {
		return
	}
	t.renewals.Add(ctx, 1, t.attrs(labels{"renew", result, "", ""}, func() []attribute.KeyValue {
		return []attribute.KeyValue{attribute.String("result", result)}
	}))
}

// refused counts one write the fence refused at step.
func (t *telemetry) refused(ctx context.Context, step string) {
	if t.metricsOff() {
		return
	}
	t.fenceRefusals.Add(ctx, 1, t.attrs(labels{"fence", step, "", ""}, func() []attribute.KeyValue {
		return []attribute.KeyValue{attribute.String("step", step)}
	}))
}

// reconciledOne counts one residual a reconcile looked at: "succeeded" or "failed" when a
// probe settled it, "open" when it was left open.
func (t *telemetry) reconciledOne(ctx context.Context, result string) {
	if t.metricsOff() {
		return
	}
	t.reconciled.Add(ctx, 1, t.attrs(labels{"reconcile", result, "", ""}, func() []attribute.KeyValue {
		return []attribute.KeyValue{attribute.String("result", result)}
	}))
}

// spanError marks the span in ctx failed with err's error.type.
func spanError(ctx context.Context, err error) {
	span := trace.SpanFromContext(ctx)
	if err == nil || !span.IsRecording() {
		return
	}
	et := errorType(err)
	span.SetAttributes(AttrErrorType.String(et))
	span.SetStatus(codes.Error, et)
}

// ObserveLedger registers observable gauges over l with mp (nil: the global provider):
// toolfence.residuals.open{state} (pending, unknown, accepted, by effective state),
// toolfence.residuals.oldest.age{state} in seconds, and toolfence.ledger.up (1 when the
// last count succeeded, 0 when the ledger could not be read), and, for a ledger that
// implements ledger.ReplicaCounter (PostgreSQL), toolfence.ledger.async_replicas (standbys
// streaming while none is synchronous: a failover can lose acknowledged writes). Each
// collection makes one OpenResiduals call, which backends answer from an index, never a
// scan of every residual, and one AsyncReplicas call.
// It returns the registration to unregister with, or an error when l does not implement
// ledger.OpenCounter or an instrument cannot be made.
func ObserveLedger(mp metric.MeterProvider, l ledger.Ledger) (metric.Registration, error) {
	oc, ok := l.(ledger.OpenCounter)
	if !ok {
		return nil, fmt.Errorf("%w: the ledger %T cannot count open residuals", ErrInvalidOptions, l)
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	open, err1 := m.Int64ObservableGauge("toolfence.residuals.open", metric.WithUnit("{residual}"),
		metric.WithDescription("Open residuals by effective state (pending, unknown, accepted)."))
	age, err2 := m.Float64ObservableGauge("toolfence.residuals.oldest.age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest open residual's current attempt, by effective state (0 when there is none)."))
	up, err3 := m.Int64ObservableGauge("toolfence.ledger.up",
		metric.WithDescription("1 when the ledger answered the last count of open residuals, 0 when it could not be read."))
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, err
	}
	instruments := []metric.Observable{open, age, up}
	rc, replicas := l.(ledger.ReplicaCounter)
	var async metric.Int64ObservableGauge
	if replicas {
		var err error
		if async, err = m.Int64ObservableGauge("toolfence.ledger.async_replicas", metric.WithUnit("{standby}"),
			metric.WithDescription("Standbys streaming from the ledger's server while none is synchronous: a failover to one can lose acknowledged writes (0 when none or one is synchronous).")); err != nil {
			return nil, err
		}
		instruments = append(instruments, async)
	}
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if replicas {
			if n, err := rc.AsyncReplicas(ctx); err == nil {
				o.ObserveInt64(async, int64(n))
			}
		}
		counts, err := oc.OpenResiduals(ctx)
		if err != nil {
			o.ObserveInt64(up, 0)
			return nil
		}
		o.ObserveInt64(up, 1)
		now := time.Now()
		for _, c := range counts {
			set := metric.WithAttributes(attribute.String("state", c.State.String()))
			o.ObserveInt64(open, c.Count, set)
			a := 0.0
			if !c.Oldest.IsZero() {
				a = max(now.Sub(c.Oldest).Seconds(), 0)
			}
			o.ObserveFloat64(age, a, set)
		}
		return nil
	}, instruments...)
}
