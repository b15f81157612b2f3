package tools

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolfence/toolfence/httpguard"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger/badger"
)

// tracedInterceptor is an interceptor over a badger ledger whose spans go to the returned
// in-memory exporter.
func tracedInterceptor(t *testing.T) (*interceptor.Interceptor, *sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	clock := lease.NewFake(epoch)
	led, err := badger.Open(t.TempDir(), badger.Options{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { _ = led.Close() })
	ic, err := interceptor.New(led, interceptor.Options{Clock: clock, LeaseTTL: testTTL, Holder: "api", TracerProvider: tp})
	require.NoError(t, err)
	return ic, tp, spans
}

// One trace crosses the guard: a client sends traceparent to an endpoint behind httpguard,
// the guarded call's execute_tool span is a child of the client's span, and the handler's
// request upstream through Transport carries a traceparent of the same trace whose parent is
// that execute_tool span. Neither library touches the global propagator.
func TestTraceCrossesHTTPGuardAndTransport(t *testing.T) {
	t.Parallel()
	w3c := propagation.TraceContext{}

	var mu sync.Mutex
	var upstreamHeaders []http.Header
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		upstreamHeaders = append(upstreamHeaders, r.Header.Clone())
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"charge":"ch_1"}`)
	}))
	t.Cleanup(upstream.Close)

	ic, _, spans := tracedInterceptor(t)

	client := &http.Client{Transport: &Transport{Propagator: w3c}}
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, upstream.URL+"/v1/charges", r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})
	guard, err := httpguard.New(ic, httpguard.Options{
		Operation: "charge", Propagator: w3c,
		Principal: func(*http.Request) (string, error) { return "agent", nil },
	})
	require.NoError(t, err)
	srv := httptest.NewServer(guard.Wrap(charge))
	t.Cleanup(srv.Close)

	const (
		traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
		callerID = "00f067aa0ba902b7"
	)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"cents":100}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(httpguard.KeyHeader, `"order-7"`)
	req.Header.Set("traceparent", fmt.Sprintf("00-%s-%s-01", traceID, callerID))
	req.Header.Set("tracestate", "rojo=00f067aa0ba902b7")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)

	var tool tracetest.SpanStub
	for _, s := range spans.GetSpans() {
		if s.Name == "execute_tool charge" {
			tool = s
		}
	}
	require.Equal(t, "execute_tool charge", tool.Name, "the guarded call made its span")
	require.Equal(t, traceID, tool.SpanContext.TraceID().String(), "the guarded call joins the caller's trace")
	require.Equal(t, callerID, tool.Parent.SpanID().String(), "and is a child of the caller's span")
	require.True(t, tool.Parent.IsRemote())
	require.Equal(t, "rojo=00f067aa0ba902b7", tool.SpanContext.TraceState().String(), "tracestate is carried along")
	for _, s := range spans.GetSpans() {
		require.Equal(t, traceID, s.SpanContext.TraceID().String(), "span %s is in the caller's trace", s.Name)
	}

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, upstreamHeaders, 1)
	h := upstreamHeaders[0]
	up := trace.SpanContextFromContext(w3c.Extract(t.Context(), propagation.HeaderCarrier(h)))
	require.True(t, up.IsValid(), "the upstream got a traceparent: %v", h)
	require.Equal(t, traceID, up.TraceID().String(), "the upstream request is in the same trace")
	require.Equal(t, tool.SpanContext.SpanID(), up.SpanID(), "its parent is the guarded call's span")
	require.Equal(t, "rojo=00f067aa0ba902b7", h.Get("tracestate"))
	require.NotEmpty(t, h.Get(HeaderIdempotencyKey), "and it still carries the key")
}

// Transport never modifies the caller's request, and sends no trace headers when the
// request's context has no span.
func TestTransportInjectsIntoACopy(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("traceparent"))
		mu.Unlock()
	}))
	t.Cleanup(upstream.Close)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	client := &http.Client{Transport: &Transport{Propagator: propagation.TraceContext{}}}

	ctx, span := tp.Tracer("test").Start(t.Context(), "caller")
	defer span.End()
	for _, c := range []struct {
		name string
		req  *http.Request
		want string
	}{
		{"with a span", mustRequest(t, ctx, upstream.URL), fmt.Sprintf("00-%s-%s-01", span.SpanContext().TraceID(), span.SpanContext().SpanID())},
		{"without a span", mustRequest(t, t.Context(), upstream.URL), ""},
	} {
		resp, err := client.Do(c.req)
		require.NoError(t, err, c.name)
		resp.Body.Close()
		require.Empty(t, c.req.Header.Get("traceparent"), "%s: the caller's request is left as it was", c.name)
		mu.Lock()
		require.Equal(t, c.want, got[len(got)-1], c.name)
		mu.Unlock()
	}
}

func mustRequest(t *testing.T, ctx context.Context, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	return req
}

// A span already in the request's context (from otelhttp or another middleware) stays the
// parent: httpguard does not extract the headers a second time.
func TestHTTPGuardKeepsTheContextsSpan(t *testing.T) {
	t.Parallel()
	ic, tp, spans := tracedInterceptor(t)
	guard, err := httpguard.New(ic, httpguard.Options{
		Operation: "charge", Propagator: propagation.TraceContext{},
		Principal: func(*http.Request) (string, error) { return "agent", nil },
	})
	require.NoError(t, err)
	var server trace.SpanContext
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tp.Tracer("test").Start(r.Context(), "POST /charges", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		server = span.SpanContext()
		guard.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
		})).ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(srv.Close)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/charges", strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set(httpguard.KeyHeader, `"order-8"`)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	for _, s := range spans.GetSpans() {
		if s.Name == "execute_tool charge" {
			require.Equal(t, server.SpanID(), s.Parent.SpanID(), "the server span in the context is the parent")
			return
		}
	}
	t.Fatal("no execute_tool span")
}
