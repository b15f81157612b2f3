package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
)

// A classifier or redactor that panics after dispatch must not panic out of Do: the call
// ran, so its outcome is recorded as unknown (classifier), and nothing unredacted is cached
// (redactor).
func TestPanickingClassifierAndRedactor(t *testing.T) {
	t.Parallel()
	f := setup(t, withConfig(func(c *interceptor.Options) {
		c.Operations = map[string]interceptor.Operation{
			"classify_panics": {Classify: func(interceptor.Response, error) residual.State { panic("classifier bug") }},
		}
		c.Redact = func(op string, b []byte) []byte {
			if op == "redact_panics" {
				panic("redactor bug")
			}
			return b
		}
	}))
	ok := func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
		return interceptor.Response{Body: []byte(`{"secret":"s3cr3t"}`)}, nil
	}

	_, err := f.ic.Do(f.ctx, interceptor.Call{Operation: "classify_panics", Target: "t"}, ok)
	requireViolation(t, err, interceptor.UnknownOutcome, f.key("classify_panics", "t"))
	require.Equal(t, residual.Unknown, f.get(f.key("classify_panics", "t")).State)

	res, err := f.ic.Do(f.ctx, interceptor.Call{Operation: "redact_panics", Target: "t"}, ok)
	require.NoError(t, err)
	require.JSONEq(t, `{"secret":"s3cr3t"}`, string(res.Output), "the first caller still gets the result")
	r := f.get(f.key("redact_panics", "t"))
	require.Equal(t, residual.Succeeded, r.State)
	require.Empty(t, r.Result, "nothing unredacted is cached")
	require.Equal(t, res.ResultDigest, r.ResultDigest)
}

// What a probe learned is cached the way a tool's result is: through the redactor.
func TestReconcileRedactsProbeResult(t *testing.T) {
	t.Parallel()
	f := setup(t, withConfig(func(c *interceptor.Options) {
		c.Redact = func(op string, b []byte) []byte { return []byte(`{"secret":"[redacted]"}`) }
		c.Operations = map[string]interceptor.Operation{
			"charge": {Probe: func(context.Context, *residual.Residual) (interceptor.ProbeResult, error) {
				return interceptor.ProbeResult{Outcome: residual.Succeeded, Result: []byte(`{"secret":"s3cr3t"}`)}, nil
			}},
		}
	}))
	_, err := f.ic.Do(f.ctx, interceptor.Call{Operation: "charge", Target: "t"},
		func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
			return interceptor.Response{Status: 503}, nil
		})
	requireViolation(t, err, interceptor.UnknownOutcome, f.key("charge", "t"))
	rep, err := f.ic.Reconcile(f.ctx, interceptor.ReconcileParams{Key: f.key("charge", "t")})
	require.NoError(t, err)
	require.Len(t, rep.Settled, 1)
	r := f.get(f.key("charge", "t"))
	require.Equal(t, residual.Succeeded, r.State)
	require.JSONEq(t, `{"secret":"[redacted]"}`, string(r.Result))
}
