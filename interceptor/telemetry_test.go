package interceptor_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
)

// telemetryFixture is a fixture whose interceptor reports to an in-memory span exporter, a
// manual metric reader and a JSON log buffer.
type telemetryFixture struct {
	*fixture
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	logs   *bytes.Buffer
	tp     *sdktrace.TracerProvider
	mp     *sdkmetric.MeterProvider
}

func setupTelemetry(t *testing.T, opts ...option) *telemetryFixture {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	var logs bytes.Buffer
	opts = append(opts, withConfig(func(c *interceptor.Options) {
		c.TracerProvider, c.MeterProvider = tp, mp
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	}))
	return &telemetryFixture{fixture: setup(t, opts...), spans: exp, reader: reader, logs: &logs, tp: tp, mp: mp}
}

// span returns the one ended span named name, failing when there is not exactly one.
func (f *telemetryFixture) span(name string) tracetest.SpanStub {
	f.t.Helper()
	var found []tracetest.SpanStub
	for _, s := range f.spans.GetSpans() {
		if s.Name == name {
			found = append(found, s)
		}
	}
	require.Len(f.t, found, 1, "spans named %q", name)
	return found[0]
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

// requireAttrs asserts the span has each attribute with the value given (an int, a bool or
// a string) and none of the absent ones.
func requireAttrs(t *testing.T, s tracetest.SpanStub, want map[attribute.Key]any, absent ...attribute.Key) {
	t.Helper()
	got := attrs(s)
	for k, v := range want {
		gv, ok := got[k]
		require.True(t, ok, "span %q lacks %s (has %v)", s.Name, k, s.Attributes)
		require.Equal(t, v, gv.AsInterface(), "span %q: %s", s.Name, k)
	}
	for _, k := range absent {
		_, ok := got[k]
		require.False(t, ok, "span %q must not have %s", s.Name, k)
	}
}

// counts returns the data points of the metric name as "attr=value,…" → value.
func (f *telemetryFixture) counts(name string) map[string]int64 {
	f.t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(f.t, f.reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[labelString(p.Attributes)] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[labelString(p.Attributes)] += int64(p.Count)
				}
			}
		}
	}
	return out
}

func labelString(s attribute.Set) string {
	var parts []string
	for _, kv := range s.ToSlice() {
		parts = append(parts, string(kv.Key)+"="+kv.Value.String())
	}
	return strings.Join(parts, ",")
}

// TestSpansPerDecision runs one call for each decision and asserts its execute_tool span:
// the GenAI attributes, toolfence's own, error.type on failures, a child span per ledger
// step, and no argument or result bytes anywhere.
func TestSpansPerDecision(t *testing.T) {
	const secretArg, secretResult = "card-4242-secret", "receipt-secret"
	args := `{"amount":1200,"card":"` + secretArg + `"}`
	call := func(target string) interceptor.Call {
		return interceptor.Call{Operation: "payments.charge", Target: target, Args: []byte(args), CallID: "call_" + target}
	}
	okTool := answering(ok(`{"receipt":"`+secretResult+`"}`), nil)

	cases := []struct {
		name    string
		prepare func(f *telemetryFixture) // calls made before the one under test
		run     func(f *telemetryFixture) error
		want    map[attribute.Key]any
		errType string // "" for success
		steps   []string
	}{
		{
			name: "executed",
			run: func(f *telemetryFixture) error {
				_, err := f.ic.Do(f.ctx, call("executed"), okTool.fn)
				return err
			},
			want: map[attribute.Key]any{
				interceptor.AttrDecision: "acquired", interceptor.AttrOutcome: "succeeded", interceptor.AttrReplayed: false,
				interceptor.AttrAttempt: int64(1), interceptor.AttrToken: int64(1),
			},
			steps: []string{"reserve", "commit"},
		},
		{
			name: "replayed",
			prepare: func(f *telemetryFixture) {
				_, err := f.ic.Do(f.ctx, call("replayed"), okTool.fn)
				require.NoError(t, err)
			},
			run: func(f *telemetryFixture) error {
				_, err := f.ic.Do(f.ctx, call("replayed"), okTool.fn)
				return err
			},
			want: map[attribute.Key]any{
				interceptor.AttrDecision: "replay", interceptor.AttrOutcome: "succeeded", interceptor.AttrReplayed: true,
			},
			steps: []string{"reserve"},
		},
		{
			name: "in progress",
			prepare: func(f *telemetryFixture) {
				_, _, err := f.successor().Begin(f.ctx, call("busy"), interceptor.BeginOptions{})
				require.NoError(t, err)
			},
			run: func(f *telemetryFixture) error {
				_, err := f.ic.Do(f.ctx, call("busy"), okTool.fn)
				return err
			},
			want: map[attribute.Key]any{
				interceptor.AttrDecision: "in_progress", interceptor.AttrViolation: "in_progress", interceptor.AttrReplayed: false,
				interceptor.AttrOutcome: "pending",
			},
			errType: "in_progress",
			steps:   []string{"reserve"},
		},
		{
			name: "unknown",
			prepare: func(f *telemetryFixture) {
				_, err := f.ic.Do(f.ctx, call("unknown"), answering(interceptor.Response{}, errors.New("connection reset")).fn)
				require.Error(t, err)
			},
			run: func(f *telemetryFixture) error {
				_, err := f.ic.Do(f.ctx, call("unknown"), okTool.fn)
				return err
			},
			want: map[attribute.Key]any{
				interceptor.AttrDecision: "unknown_outcome", interceptor.AttrViolation: "unknown_outcome", interceptor.AttrOutcome: "unknown",
			},
			errType: "unknown_outcome",
			steps:   []string{"reserve"},
		},
		{
			name: "awaiting upstream",
			run: func(f *telemetryFixture) error {
				_, err := f.ic.Do(f.ctx, call("queued"), answering(interceptor.Response{Status: 202, Handle: "/jobs/7"}, nil).fn)
				return err
			},
			want: map[attribute.Key]any{
				interceptor.AttrDecision: "acquired", interceptor.AttrViolation: "awaiting_upstream", interceptor.AttrOutcome: "accepted",
			},
			errType: "awaiting_upstream",
			steps:   []string{"reserve", "commit"},
		},
		{
			name: "payload mismatch",
			prepare: func(f *telemetryFixture) {
				_, err := f.ic.Do(f.ctx, call("mismatch"), okTool.fn)
				require.NoError(t, err)
			},
			run: func(f *telemetryFixture) error {
				c := call("mismatch")
				c.Args = []byte(`{"amount":9999}`)
				_, err := f.ic.Do(f.ctx, c, okTool.fn)
				return err
			},
			want: map[attribute.Key]any{
				interceptor.AttrDecision: "payload_mismatch", interceptor.AttrViolation: "payload_mismatch",
			},
			errType: "payload_mismatch",
			steps:   []string{"reserve"},
		},
		{
			name: "lease lost",
			run: func(f *telemetryFixture) error {
				_, err := f.ic.Do(f.ctx, call("late"), newTool(func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
					f.clock.Advance(2 * testTTL) // the lease runs out while the tool runs
					return ok(`{}`), nil
				}).fn)
				return err
			},
			want: map[attribute.Key]any{
				interceptor.AttrDecision: "acquired", interceptor.AttrViolation: "lease_lost", interceptor.AttrOutcome: "lease_lost",
			},
			errType: "lease_lost",
			steps:   []string{"reserve", "commit"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := setupTelemetry(t, withConfig(func(c *interceptor.Options) { c.RenewEvery = -1 }))
			if tc.prepare != nil {
				tc.prepare(f)
			}
			f.spans.Reset()
			err := tc.run(f)
			if tc.errType == "" {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
			s := f.span("execute_tool payments.charge")
			want := map[attribute.Key]any{
				interceptor.AttrOperationName: "execute_tool", interceptor.AttrToolName: "payments.charge",
				interceptor.AttrTask: testTask, interceptor.AttrNamespace: "default",
			}
			for k, v := range tc.want {
				want[k] = v
			}
			require.Equal(t, trace.SpanKindInternal, s.SpanKind)
			if tc.errType == "" {
				requireAttrs(t, s, want, interceptor.AttrErrorType, interceptor.AttrViolation)
				require.Equal(t, codes.Unset, s.Status.Code)
			} else {
				want[interceptor.AttrErrorType] = tc.errType
				requireAttrs(t, s, want)
				require.Equal(t, codes.Error, s.Status.Code)
			}
			require.True(t, strings.HasPrefix(attrs(s)[interceptor.AttrToolCallID].AsString(), "call_"), "gen_ai.tool.call.id from Call.CallID")
			require.Regexp(t, `^tf1_[0-9a-f]{64}$`, attrs(s)[interceptor.AttrKey].AsString())

			var steps []string
			for _, c := range f.spans.GetSpans() {
				if c.Parent.SpanID() == s.SpanContext.SpanID() {
					steps = append(steps, c.Name)
					requireAttrs(t, c, map[attribute.Key]any{interceptor.AttrDBSystem: "badger", interceptor.AttrDBOperation: c.Name})
				}
				for _, kv := range c.Attributes {
					require.NotContains(t, kv.Value.String(), "secret", "span %q attribute %s carries argument or result bytes", c.Name, kv.Key)
				}
			}
			require.Equal(t, tc.steps, steps, "child spans of the ledger steps, in order")
			require.NotContains(t, f.logs.String(), "secret", "logs carry no arguments or results")
		})
	}
}

// TestMetricsCountCalls checks toolfence.calls, the call and step durations, renewals and
// fence refusals against the calls made, and that refused calls are logged with their key
// and recovery.
func TestMetricsCountCalls(t *testing.T) {
	f := setupTelemetry(t, withConfig(func(c *interceptor.Options) { c.RenewEvery = -1 }))
	okTool := answering(ok(`{}`), nil)
	_, err := f.ic.Do(f.ctx, charge(chargeArgs), okTool.fn)
	require.NoError(t, err)
	_, err = f.ic.Do(f.ctx, charge(chargeArgs), okTool.fn) // replay
	require.NoError(t, err)
	_, err = f.ic.Do(f.ctx, charge(`{"amount":1}`), okTool.fn) // payload mismatch
	requireViolation(t, err, interceptor.PayloadMismatch, f.key("payments.charge", "invoice:INV-42"))
	_, err = f.ic.Do(f.ctx, interceptor.Call{Operation: "email.send", Target: "bob"}, answering(interceptor.Response{}, errors.New("timeout")).fn)
	requireViolation(t, err, interceptor.UnknownOutcome, f.key("email.send", "bob"))
	_, err = f.ic.Do(context.Background(), charge(chargeArgs), okTool.fn) // no task
	require.ErrorIs(t, err, interceptor.ErrNoTask)
	a, _, err := f.ic.Begin(f.ctx, interceptor.Call{Operation: "email.send", Target: "carol"}, interceptor.BeginOptions{})
	require.NoError(t, err)
	_, err = a.Renew(f.ctx, 0)
	require.NoError(t, err)
	f.clock.Advance(2 * testTTL)
	_, err = a.Renew(f.ctx, 0)
	requireViolation(t, err, interceptor.LeaseLost, a.Dispatch.Key)
	_, err = a.Commit(f.ctx, ok(`{}`), nil)
	requireViolation(t, err, interceptor.LeaseLost, a.Dispatch.Key)

	require.Equal(t, map[string]int64{
		"operation=payments.charge,reason=succeeded,result=executed":       1,
		"operation=payments.charge,reason=,result=replayed":                1,
		"operation=payments.charge,reason=payload_mismatch,result=refused": 1,
		"operation=email.send,reason=unknown,result=executed":              1,
		"operation=payments.charge,reason=no_task,result=error":            1,
		"operation=email.send,reason=lease_lost,result=executed":           1,
	}, f.counts("toolfence.calls"))
	require.Equal(t, map[string]int64{
		"operation=payments.charge,result=executed": 1, "operation=payments.charge,result=replayed": 1,
		"operation=payments.charge,result=refused": 1, "operation=email.send,result=executed": 1,
		"operation=payments.charge,result=error": 1,
	}, f.counts("toolfence.call.duration"), "Do records one duration per call")
	require.Equal(t, map[string]int64{"result=ok": 1, "result=lease_lost": 1}, f.counts("toolfence.lease.renewals"))
	require.Equal(t, map[string]int64{"step=renew": 1, "step=commit": 1}, f.counts("toolfence.fence.refusals"))
	steps := f.counts("toolfence.ledger.step.duration")
	require.Equal(t, int64(5), steps["db.system.name=badger,step=reserve"], "every reservation: 4 by Do, 1 by Begin")
	require.Equal(t, int64(1), steps["db.system.name=badger,error.type=lease_lost,step=commit"])
	require.Equal(t, int64(1), steps["db.system.name=badger,error.type=lease_lost,step=renew"])

	logs := f.logs.String()
	for _, want := range []string{`"kind":"payload_mismatch"`, `"kind":"unknown_outcome"`, `"kind":"lease_lost"`, `"recovery":"`, `"key":"tf1_`} {
		require.Contains(t, logs, want)
	}
	require.Equal(t, 4, strings.Count(logs, "\n"), "one line per refused or ambiguous call (and the not-dispatched one)")
}

// TestOperationLabelsAreCapped: a client inventing tool names cannot grow the metrics
// without bound; names past MaxOperationLabels count as "_other".
func TestOperationLabelsAreCapped(t *testing.T) {
	f := setupTelemetry(t)
	for i := range interceptor.MaxOperationLabels + 5 {
		_, err := f.ic.Do(f.ctx, interceptor.Call{Operation: "op" + string(rune('A'+i/26)) + string(rune('a'+i%26)), Target: "t"}, answering(ok(`{}`), nil).fn)
		require.NoError(t, err)
	}
	c := f.counts("toolfence.calls")
	require.Len(t, c, interceptor.MaxOperationLabels+1)
	require.Equal(t, int64(5), c["operation=_other,reason=succeeded,result=executed"])
}

// TestReconcileSpanAndCounts: a reconcile makes its span with a resolve child per settled
// residual and counts what it settled and what it left open.
func TestReconcileSpanAndCounts(t *testing.T) {
	f := setupTelemetry(t)
	require.NoError(t, f.ic.Register("email.send", interceptor.Operation{Probe: func(context.Context, *residual.Residual) (interceptor.ProbeResult, error) {
		return interceptor.ProbeResult{Outcome: "succeeded", Evidence: "found"}, nil
	}}))
	for _, op := range []string{"email.send", "sms.send"} {
		_, err := f.ic.Do(f.ctx, interceptor.Call{Operation: op, Target: "x"}, answering(interceptor.Response{}, errors.New("timeout")).fn)
		require.Error(t, err)
	}
	f.spans.Reset()
	rep, err := f.ic.Reconcile(f.ctx, interceptor.ReconcileParams{})
	require.NoError(t, err)
	require.Len(t, rep.Settled, 1)
	require.Len(t, rep.Unsettled, 1)
	s := f.span("toolfence.reconcile")
	r := f.span("resolve")
	require.Equal(t, s.SpanContext.SpanID(), r.Parent.SpanID())
	require.Equal(t, map[string]int64{"result=succeeded": 1, "result=open": 1}, f.counts("toolfence.reconcile.residuals"))
}

// TestBeginSettleCountsOnlyTheOutcome: with BeginOptions.Settle, a key blocked by an unknown
// outcome is offered to Settle once; when Settle resolves it, Begin reserves again and only
// that (here a replay) is counted and logged, not the refusal that Settle cleared. When
// Settle cannot, the refusal is counted and logged once; a payload mismatch never reaches
// Settle.
func TestBeginSettleCountsOnlyTheOutcome(t *testing.T) {
	f := setupTelemetry(t, withConfig(func(c *interceptor.Options) { c.RenewEvery = -1 }))
	call := interceptor.Call{Operation: "email.send", Target: "bob", Args: []byte(`{"to":"bob"}`)}
	_, err := f.ic.Do(f.ctx, call, answering(interceptor.Response{}, errors.New("timeout")).fn)
	requireViolation(t, err, interceptor.UnknownOutcome, f.key("email.send", "bob"))
	f.logs.Reset()

	var offered []interceptor.Kind
	var unsettled interceptor.BeginOptions
	unsettled.Settle = func(_ context.Context, v *interceptor.Violation) bool {
		offered = append(offered, v.Kind)
		return false
	}
	_, _, err = f.ic.Begin(f.ctx, call, unsettled)
	requireViolation(t, err, interceptor.UnknownOutcome, f.key("email.send", "bob"))
	require.Equal(t, []interceptor.Kind{interceptor.UnknownOutcome}, offered)
	require.Equal(t, 1, strings.Count(f.logs.String(), `"kind":"unknown_outcome"`), "the refusal Settle could not clear is logged once")

	f.logs.Reset()
	settle := interceptor.BeginOptions{Settle: func(ctx context.Context, v *interceptor.Violation) bool {
		offered = append(offered, v.Kind)
		_, err := f.ic.Resolve(ctx, interceptor.ResolveParams{Key: v.Key, As: residual.Succeeded, By: "probe", Note: "found it", Result: []byte(`"sent"`), IfToken: v.Token})
		require.NoError(t, err)
		return true
	}}
	a, res, err := f.ic.Begin(f.ctx, call, settle)
	require.NoError(t, err)
	require.Nil(t, a)
	require.True(t, res.Replayed)
	require.Equal(t, []byte(`"sent"`), res.Output)
	require.Len(t, offered, 2)
	require.Empty(t, f.logs.String(), "a key Settle cleared is not reported as refused")

	_, _, err = f.ic.Begin(f.ctx, interceptor.Call{Operation: "email.send", Target: "bob", Args: []byte(`{"to":"eve"}`)}, settle)
	requireViolation(t, err, interceptor.PayloadMismatch, f.key("email.send", "bob"))
	require.Len(t, offered, 2, "a payload mismatch is not offered to Settle")

	require.Equal(t, map[string]int64{
		"operation=email.send,reason=unknown,result=executed":         1,
		"operation=email.send,reason=unknown_outcome,result=refused":  1,
		"operation=email.send,reason=,result=replayed":                1,
		"operation=email.send,reason=payload_mismatch,result=refused": 1,
	}, f.counts("toolfence.calls"))
}
