package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	lctools "github.com/tmc/langchaingo/tools"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/jsonptr"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

const testTTL = 10 * time.Second

var epoch = time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)

// bundle is one test's world: a fake clock driving the interceptor and a real badger ledger
// in a temp dir, and a context carrying the task.
type bundle struct {
	clock *lease.Fake
	ic    *interceptor.Interceptor
	ctx   context.Context
}

func setup(t *testing.T) *bundle {
	t.Helper()
	clock := lease.NewFake(epoch)
	led, err := badger.Open(t.TempDir(), badger.Options{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { _ = led.Close() })
	ic, err := interceptor.New(led, interceptor.Options{Clock: clock, LeaseTTL: testTTL, Holder: "agent-a"})
	require.NoError(t, err)
	return &bundle{clock: clock, ic: ic, ctx: interceptor.WithTask(t.Context(), "run-42")}
}

// funcTool is a langchaingo tool made of a function; it counts its calls.
type funcTool struct {
	name  string
	fn    func(ctx context.Context, input string) (string, error)
	calls atomic.Int32
}

func (f *funcTool) Name() string        { return f.name }
func (f *funcTool) Description() string { return "test tool " + f.name }
func (f *funcTool) Call(ctx context.Context, input string) (string, error) {
	f.calls.Add(1)
	return f.fn(ctx, input)
}

func tool(name string, fn func(ctx context.Context, input string) (string, error)) *funcTool {
	return &funcTool{name: name, fn: fn}
}

func TestGuardReplayReturnsCachedOutputByteForByte(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Odd bytes on purpose: whitespace, quotes, newlines, non-ASCII and invalid UTF-8.
	output := " {\"charge\": \"ch_1\"}\n\t«€» \xff\x00 end "
	inner := tool("charge_invoice", func(context.Context, string) (string, error) { return output, nil })
	g := Guard(inner, b.ic, WithTarget("/invoice"))
	var _ lctools.Tool = g

	first, err := g.Call(b.ctx, `{"invoice":"INV-42","amount":125}`)
	require.NoError(t, err)
	require.Equal(t, output, first)

	b.clock.Advance(time.Minute)
	// Semantically equal args (key order, number spelling) replay too.
	second, err := g.Call(b.ctx, `{"amount":125.0, "invoice":"INV-42"}`)
	require.NoError(t, err)
	require.Equal(t, int32(1), inner.calls.Load(), "a replay dispatches nothing")
	prefix := "[replayed] already done, outcome recorded at " + epoch.Format(time.RFC3339) + ": "
	require.True(t, strings.HasPrefix(second, prefix), second)
	require.Equal(t, []byte(output), []byte(strings.TrimPrefix(second, prefix)), "the cached output, byte for byte")

	// The same through the interceptor's own record.
	res, err := b.ic.Do(b.ctx, interceptor.Call{Operation: "charge_invoice", Target: "INV-42", Args: json.RawMessage(`{"invoice":"INV-42","amount":125}`)},
		func(context.Context, interceptor.Dispatch) (interceptor.Response, error) { panic("must not run") })
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, []byte(output), res.Output)
}

func TestGuardWithoutTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inner := tool("charge_invoice", func(context.Context, string) (string, error) { return "ok", nil })
	out, err := Guard(inner, b.ic, WithTarget("/invoice")).Call(t.Context(), `{"invoice":"INV-1"}`)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, "toolfence: no task"), out)
	require.Contains(t, out, "charge_invoice was not run")

	_, err = Guard(inner, b.ic, WithTarget("/invoice"), WithErrors()).Call(t.Context(), `{"invoice":"INV-1"}`)
	require.ErrorIs(t, err, interceptor.ErrNoTask)
	require.Zero(t, inner.calls.Load())
}

func TestGuardTargetErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inner := tool("charge_invoice", func(context.Context, string) (string, error) { return "ok", nil })
	out, err := Guard(inner, b.ic, WithTarget("/invoice_id")).Call(b.ctx, `{"invoice":"INV-1"}`)
	require.NoError(t, err)
	require.Contains(t, out, `JSON pointer "/invoice_id" is not in the input`)
	require.True(t, strings.HasPrefix(out, "invalid input for charge_invoice, nothing was sent"), out)

	_, err = Guard(inner, b.ic, WithTarget("/invoice_id"), WithErrors()).Call(b.ctx, `{"invoice":"INV-1"}`)
	require.ErrorIs(t, err, jsonptr.ErrNoTarget)
	require.EqualError(t, err, `jsonptr: target not found in input: tool "charge_invoice": JSON pointer "/invoice_id" is not in the input`)
	_, err = Guard(inner, b.ic, WithTarget("/invoice"), WithErrors()).Call(b.ctx, `charge INV-1`)
	require.ErrorIs(t, err, ErrInvalidInput, "non-JSON input needs WithOpaqueInput")
	require.Zero(t, inner.calls.Load())

	// Configuration errors are Go errors in every mode.
	for _, g := range []*Guarded{Guard(inner, b.ic), Guard(inner, b.ic, WithTarget("invoice")), Guard(inner, nil, WithTarget("/a")), Guard(nil, b.ic)} {
		require.ErrorIs(t, g.Err(), interceptor.ErrInvalidOptions)
		_, err := g.Call(b.ctx, `{}`)
		require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
	}

	fn := Guard(inner, b.ic, WithTargetFunc(func(string) (string, error) { return "", errors.New("no invoice named") }), WithErrors())
	_, err = fn.Call(b.ctx, `{}`)
	require.ErrorIs(t, err, jsonptr.ErrNoTarget)
	require.ErrorContains(t, err, "no invoice named")
}

func TestGuardOpaqueInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inner := tool("shell", func(_ context.Context, in string) (string, error) { return "ran " + in, nil })
	g := Guard(inner, b.ic, WithOpaqueInput())
	out, err := g.Call(b.ctx, "deploy web-1")
	require.NoError(t, err)
	require.Equal(t, "ran deploy web-1", out)
	out, err = g.Call(b.ctx, "deploy web-1")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, interceptor.ReplayPrefix), out)
	out, err = g.Call(b.ctx, "deploy web-2")
	require.NoError(t, err)
	require.Equal(t, "ran deploy web-2", out)
	require.Equal(t, int32(2), inner.calls.Load())
	key := b.ic.Key("run-42", "shell", "deploy web-1")
	_, err = b.ic.Ledger().Get(b.ctx, ledgerGet(b, key))
	require.NoError(t, err, "the whole input is the target")
}

func TestGuardUnknownOutcomeBlocks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inner := tool("charge_invoice", func(context.Context, string) (string, error) {
		return "", errors.New("read tcp: connection reset by peer")
	})
	g := Guard(inner, b.ic, WithTarget("/invoice"), WithUpstreamName("the payment API"))
	out, err := g.Call(b.ctx, `{"invoice":"INV-42"}`)
	require.NoError(t, err)
	key := b.ic.Key("run-42", "charge_invoice", "INV-42")
	want := "blocked: a previous attempt may have reached the payment API; outcome unknown; do not retry — reconcile with toolfence (key " + key + ")"
	require.Equal(t, want, out)

	out, err = g.Call(b.ctx, `{"invoice":"INV-42"}`)
	require.NoError(t, err)
	require.Equal(t, want, out)
	require.Equal(t, int32(1), inner.calls.Load(), "an unknown outcome is never retried blindly")

	_, err = Guard(inner, b.ic, WithTarget("/invoice"), WithErrors()).Call(b.ctx, `{"invoice":"INV-42"}`)
	var v *interceptor.Violation
	require.ErrorAs(t, err, &v)
	require.Equal(t, interceptor.UnknownOutcome, v.Kind)
	require.ErrorIs(t, err, residual.ErrUnknownOutcome)

	// Without a name, the observation names the operation.
	out, _ = Guard(inner, b.ic, WithTarget("/invoice")).Call(b.ctx, `{"invoice":"INV-42"}`)
	require.Contains(t, out, "may have reached the upstream of charge_invoice;")
}

func TestGuardInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	entered, release := make(chan struct{}), make(chan struct{})
	inner := tool("send_email", func(context.Context, string) (string, error) {
		close(entered)
		<-release
		return "sent", nil
	})
	g := Guard(inner, b.ic, WithTarget("/to"))
	done := make(chan string)
	go func() {
		out, _ := g.Call(b.ctx, `{"to":"bob@example.com"}`)
		done <- out
	}()
	<-entered
	out, err := g.Call(b.ctx, `{"to":"bob@example.com"}`)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, `blocked: another attempt at send_email on "bob@example.com" is still running`), out)
	require.Contains(t, out, "check again in 10s, when its lease expires")
	close(release)
	require.Equal(t, "sent", <-done)
	require.Equal(t, int32(1), inner.calls.Load())
}

func TestGuardPayloadMismatchShowsFirstResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inner := tool("send_email", func(_ context.Context, in string) (string, error) { return `{"id":"msg_1"}`, nil })
	g := Guard(inner, b.ic, WithTarget("/to", "/kind"))
	_, err := g.Call(b.ctx, `{"to":"bob@example.com","kind":"welcome","body":"Hi Bob!"}`)
	require.NoError(t, err)
	out, err := g.Call(b.ctx, `{"to":"bob@example.com","kind":"welcome","body":"Hello Bob, welcome aboard!"}`)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, `refused: send_email on ["bob@example.com","welcome"] was already done on `+epoch.Format(time.RFC3339)+` with different arguments`), out)
	require.Contains(t, out, `the first result stands: {"id":"msg_1"} (key tf1_`)
	require.Equal(t, int32(1), inner.calls.Load())

	_, err = Guard(inner, b.ic, WithTarget("/to", "/kind"), WithErrors()).Call(b.ctx, `{"to":"bob@example.com","kind":"welcome","body":"Yo"}`)
	require.ErrorIs(t, err, residual.ErrPayloadMismatch)
}

func TestGuardLeaseLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inner := tool("deploy", func(context.Context, string) (string, error) {
		b.clock.Advance(2 * testTTL) // the call outlives its lease
		return "deployed", nil
	})
	out, err := Guard(inner, b.ic, WithTarget("/service")).Call(b.ctx, `{"service":"web"}`)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, "blocked: this attempt lost its lease before its outcome was recorded"), out)
}

// httpTool posts its input to url through a Transport, the way a real tool would.
func httpTool(name, url string) *funcTool {
	client := &http.Client{Transport: &Transport{}}
	return tool(name, func(ctx context.Context, input string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(input))
		if err != nil {
			return "", err
		}
		resp, err := client.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 300 {
			return "", fmt.Errorf("upstream answered %s: %s", resp.Status, body)
		}
		return string(body), nil
	})
}

func TestGuardClassifiesThroughTransport(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	status, keys := 422, []string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get(HeaderIdempotencyKey)+"/"+r.Header.Get(HeaderFencingToken))
		if status == 202 {
			w.Header().Set("Location", "/jobs/1")
		}
		w.WriteHeader(status)
		_, _ = fmt.Fprintf(w, `{"status":%d}`, status)
	}))
	defer srv.Close()
	setStatus := func(s int) { mu.Lock(); status = s; mu.Unlock() }

	b := setup(t)
	g := Guard(httpTool("fire_webhook", srv.URL), b.ic, WithTarget("/event"), WithUpstreamName("the webhook API"))
	key := b.ic.Key("run-42", "fire_webhook", "evt_1")

	// 422: refused with no effect; the attempt failed and may be retried.
	out, err := g.Call(b.ctx, `{"event":"evt_1"}`)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, "failed: the webhook API refused the request and did nothing"), out)
	r, err := b.ic.Ledger().Get(b.ctx, ledgerGet(b, key))
	require.NoError(t, err)
	require.Equal(t, residual.Failed, r.State)

	// 202: accepted, with the Location as handle; never a success.
	setStatus(202)
	out, err = g.Call(b.ctx, `{"event":"evt_1"}`)
	require.NoError(t, err)
	require.Equal(t, "accepted: the webhook API accepted the request and is still working on it (status: "+srv.URL+
		"/jobs/1); it is not done yet; do not retry — wait, then check again (key "+key+")", out)
	r, err = b.ic.Ledger().Get(b.ctx, ledgerGet(b, key))
	require.NoError(t, err)
	require.Equal(t, residual.Accepted, r.State)
	require.Equal(t, srv.URL+"/jobs/1", r.Handle)

	mu.Lock()
	require.Equal(t, []string{`"` + key + `"/1`, `"` + key + `"/2`}, keys, "the key and each attempt's fencing token reach upstream")
	mu.Unlock()

	// 503 after the tool returned no error: still unknown.
	g2 := Guard(tool("notify", func(ctx context.Context, in string) (string, error) {
		setStatus(503)
		resp, err := (&http.Client{Transport: &Transport{}}).Post(srv.URL, "application/json", nil)
		require.ErrorIs(t, err, interceptor.ErrNoDispatch, "a client that drops the context sends nothing")
		require.Nil(t, resp)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		resp, err = (&http.Client{Transport: &Transport{}}).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return "sent, probably", nil
	}), b.ic, WithTarget("/to"))
	out, err = g2.Call(b.ctx, `{"to":"ops"}`)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, "blocked: a previous attempt may have reached the upstream of notify; outcome unknown"), out)
}

func TestReconcilerTool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.ic.Register("charge_invoice", interceptor.Operation{
		Probe: func(ctx context.Context, r *residual.Residual) (interceptor.ProbeResult, error) {
			return interceptor.ProbeResult{Outcome: residual.Succeeded, Result: []byte(`{"charge":"ch_1"}`), Evidence: "found ch_1"}, nil
		},
	}))
	inner := tool("charge_invoice", func(context.Context, string) (string, error) { return "", errors.New("timeout") })
	g := Guard(inner, b.ic, WithTarget("/invoice"))
	out, _ := g.Call(b.ctx, `{"invoice":"INV-42"}`)
	require.Contains(t, out, "outcome unknown")

	rec := Reconciler(b.ic)
	require.Equal(t, ReconcileToolName, rec.Name())
	out, err := rec.Call(b.ctx, `{}`)
	require.NoError(t, err)
	key := b.ic.Key("run-42", "charge_invoice", "INV-42")
	require.True(t, strings.HasPrefix(out, "settled: "+key+" was unknown and is now succeeded (found ch_1)"), out)

	out, err = g.Call(b.ctx, `{"invoice":"INV-42"}`)
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(out, `: {"charge":"ch_1"}`), out)
	require.True(t, strings.HasPrefix(out, interceptor.ReplayPrefix), out)
	require.Equal(t, int32(1), inner.calls.Load())

	out, _ = rec.Call(b.ctx, key)
	require.Contains(t, out, "already succeeded")
	out, _ = rec.Call(t.Context(), "")
	require.Contains(t, out, "no task")
	out, _ = rec.Call(interceptor.WithTask(t.Context(), "someone-else"), key)
	require.Equal(t, "refused: key "+key+" belongs to another task; nothing was reconciled", out)
	other := b.ic.Key("run-42", "charge_invoice", "INV-43")
	out, _ = rec.Call(b.ctx, `{"key":"`+other+`"}`)
	require.Equal(t, "nothing to reconcile: toolfence has no call with key "+other, out)
}

func TestTypedToolGuarded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	charge, err := New("charge_invoice", "Charge an invoice.", func(ctx context.Context, in chargeInput) (chargeOutput, error) {
		calls.Add(1)
		d, ok := interceptor.DispatchFrom(ctx)
		require.True(t, ok)
		require.Equal(t, "INV-7", d.Target)
		return chargeOutput{ChargeID: "ch_" + in.InvoiceID}, nil
	})
	require.NoError(t, err)
	g := charge.Tool(b.ic)
	out, err := g.Call(b.ctx, `{"invoice_id":"INV-7","amount_cents":100,"currency":"EUR"}`)
	require.NoError(t, err)
	require.Equal(t, `{"charge_id":"ch_INV-7"}`, out)

	// Invalid input is refused before anything is reserved.
	out, err = g.Call(b.ctx, `{"invoice_id":"INV-8","amount_cents":"100","currency":"EUR"}`)
	require.NoError(t, err)
	require.Contains(t, out, `field "/amount_cents" must be an integer, got a string`)
	_, err = b.ic.Ledger().Get(b.ctx, ledgerGet(b, b.ic.Key("run-42", "charge_invoice", "INV-8")))
	require.ErrorIs(t, err, residual.ErrNotFound, "nothing was reserved")

	out, err = g.Call(b.ctx, `{"invoice_id":"INV-7","amount_cents":100,"currency":"EUR"}`)
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(out, `: {"charge_id":"ch_INV-7"}`), out)
	require.Equal(t, int32(1), calls.Load())
}

func ledgerGet(b *bundle, key string) ledger.GetParams {
	return ledger.GetParams{Namespace: b.ic.Namespace(), Key: key}
}

// countingServer answers every request with status and counts the requests it received.
func countingServer(t *testing.T, status int) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// A tool that claims "no effect" cannot override an ambiguous answer Transport observed: a
// 503 to a POST may have had an effect, so the outcome is unknown and nothing re-runs.
func TestGuardNoEffectClaimCannotOverrideObserved5xx(t *testing.T) {
	t.Parallel()
	srv, posts := countingServer(t, http.StatusServiceUnavailable)

	b := setup(t)
	g := Guard(tool("notify", func(ctx context.Context, in string) (string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		resp, err := (&http.Client{Transport: &Transport{}}).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return "", interceptor.NoEffect(errors.New("upstream said 503, surely nothing happened"))
	}), b.ic, WithTarget("/to"))
	for range 2 {
		out, err := g.Call(b.ctx, `{"to":"ops"}`)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(out, "blocked: a previous attempt may have reached the upstream of notify; outcome unknown"), out)
	}
	require.EqualValues(t, 1, posts.Load(), "the second call must not dispatch again")
}

// A request built without the tool's context never leaves the process: the attempt is
// recorded failed (not dispatched), so the key is not locked as unknown, and the observation
// says the tool, not the input, is at fault. A tool fixed to use its ctx then runs.
func TestRequestWithoutToolContextIsNotDispatched(t *testing.T) {
	t.Parallel()
	srv, hits := countingServer(t, http.StatusCreated)
	client := &http.Client{Transport: &Transport{}}
	useCtx := atomic.Bool{}
	send := tool("charge_invoice", func(ctx context.Context, input string) (string, error) {
		reqCtx := context.Background() // the bug: not the ctx the tool was given
		if useCtx.Load() {
			reqCtx = ctx
		}
		req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, srv.URL, strings.NewReader(input))
		if err != nil {
			return "", err
		}
		resp, err := client.Do(req)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		return "charged", nil
	})
	b := setup(t)
	key := b.ic.Key("run-42", "charge_invoice", "INV-1")

	out, err := Guard(send, b.ic, WithTarget("/invoice")).Call(b.ctx, `{"invoice":"INV-1"}`)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, "failed: charge_invoice did not send its request"), out)
	require.Contains(t, out, "retrying will not help")
	require.Contains(t, out, "build the request from the context the tool was given")
	r, err := b.ic.Ledger().Get(b.ctx, ledgerGet(b, key))
	require.NoError(t, err)
	require.Equal(t, residual.Failed, r.State, "provably not sent: failed, not unknown")
	require.Zero(t, hits.Load())

	_, err = Guard(send, b.ic, WithTarget("/invoice"), WithErrors()).Call(b.ctx, `{"invoice":"INV-1"}`)
	require.ErrorIs(t, err, interceptor.ErrCallFailed)
	require.ErrorIs(t, err, interceptor.ErrNoDispatch)

	useCtx.Store(true)
	out, err = Guard(send, b.ic, WithTarget("/invoice")).Call(b.ctx, `{"invoice":"INV-1"}`)
	require.NoError(t, err)
	require.Equal(t, "charged", out, "the key was not locked: the fixed tool runs")
	require.EqualValues(t, 1, hits.Load())
}

// TestReplayObservationOfAnEmptyOutput: a key resolved without a result replays as the note
// alone, with no dangling ": ".
func TestReplayObservationOfAnEmptyOutput(t *testing.T) {
	t.Parallel()
	res := &interceptor.Result{Replayed: true, RecordedAt: epoch}
	require.Equal(t, "[replayed] already done, outcome recorded at "+epoch.Format(time.RFC3339), replayObservation(res))
	res.Output = []byte("ok")
	require.Equal(t, "[replayed] already done, outcome recorded at "+epoch.Format(time.RFC3339)+": ok", replayObservation(res))
}
