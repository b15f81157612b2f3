package mcpproxy_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/mcpwire"
)

// lockedBuffer is a log destination safe for concurrent writes and reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// traced is a proxy run in-process between an official Go SDK host and an in-process
// upstream, its interceptor reporting to an in-memory span exporter.
type traced struct {
	host  *mcp.ClientSession
	spans *tracetest.InMemoryExporter
	logs  *lockedBuffer
	// metas has the _meta of each tools/call upstream received, in order.
	mu    sync.Mutex
	metas []map[string]any
	// isError makes upstream's append tool answer with isError (after its effect).
	isError bool
}

func setupTraced(t *testing.T) *traced {
	t.Helper()
	otel.SetTextMapPropagator(propagation.TraceContext{}) // what the binary sets; idempotent
	tr := &traced{spans: tracetest.NewInMemoryExporter(), logs: &lockedBuffer{}}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tr.spans))
	l, err := badger.Open(t.TempDir(), badger.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	// One logger for both, as the binary has: the interceptor logs the guarded calls.
	log := slog.New(slog.NewTextHandler(tr.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ic, err := interceptor.New(l, interceptor.Options{TracerProvider: tp, Logger: log})
	require.NoError(t, err)
	pol, err := policy.Parse([]byte(`{"tools": {"append": {"target": ["/target"]}}}`))
	require.NoError(t, err)
	p, err := mcpproxy.New(ic, mcpproxy.Options{ServerID: "fixture", Policy: pol, Logger: log})
	require.NoError(t, err)

	// The upstream: append (protected) and read (read-only, bypassed), each recording _meta.
	up := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "1"}, nil)
	record := func(req *mcp.CallToolRequest) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		tr.metas = append(tr.metas, map[string]any(req.Params.Meta))
	}
	mcp.AddTool(up, &mcp.Tool{Name: "append"}, func(_ context.Context, req *mcp.CallToolRequest, in appendIn) (*mcp.CallToolResult, any, error) {
		record(req)
		tr.mu.Lock()
		isError := tr.isError
		tr.mu.Unlock()
		return &mcp.CallToolResult{IsError: isError, Content: []mcp.Content{&mcp.TextContent{Text: "appended " + in.Text}}}, nil, nil
	})
	mcp.AddTool(up, &mcp.Tool{Name: "read", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, func(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		record(req)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "read"}}}, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	upServer, upProxy := mcp.NewInMemoryTransports()
	ss, err := up.Connect(ctx, upServer, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ss.Close() })
	upConn, err := upProxy.Connect(ctx)
	require.NoError(t, err)

	hostSide, proxySide := mcp.NewInMemoryTransports()
	downConn, err := proxySide.Connect(ctx)
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, downConn, upConn) }()
	tr.host, err = mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil).Connect(ctx, hostSide, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = tr.host.Close()
		require.NoError(t, <-served, "Serve ends cleanly when the host goes")
	})
	return tr
}

// spansNamed returns the ended spans named name.
func (tr *traced) spansNamed(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range tr.spans.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attrMap(s tracetest.SpanStub) map[attribute.Key]any {
	m := map[attribute.Key]any{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value.AsInterface()
	}
	return m
}

// hostParent is the agent's span: the parent the host names in _meta.
func hostParent(t *testing.T) (trace.SpanContext, mcp.Meta) {
	t.Helper()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp}))
	require.True(t, sc.IsValid())
	return sc, mcp.Meta{"traceparent": tp, "tracestate": "vendor=1"}
}

// TestProxySpanIsChildOfMetaTraceparent: a host's tools/call with traceparent in _meta gets
// the proxy's SERVER span "tools/call append" as a child of the host's span, the
// interceptor's execute_tool span and ledger steps under it, and upstream receives a
// traceparent of the same trace whose parent is the execute_tool span. A replay is traced
// the same way and sends nothing upstream.
func TestProxySpanIsChildOfMetaTraceparent(t *testing.T) {
	t.Parallel()
	tr := setupTraced(t)
	parent, meta := hostParent(t)
	args := map[string]any{"target": "inbox:bob", "text": "secret-body"}

	res := call(t, tr.host, "append", args, meta)
	require.False(t, res.IsError, text(res))

	mcpSpans := tr.spansNamed("tools/call append")
	require.Len(t, mcpSpans, 1)
	ms := mcpSpans[0]
	require.Equal(t, trace.SpanKindServer, ms.SpanKind)
	require.Equal(t, parent.TraceID(), ms.SpanContext.TraceID(), "the proxy's span joins the host's trace")
	require.Equal(t, parent.SpanID(), ms.Parent.SpanID(), "the proxy's span is the child of the host's span")
	require.True(t, ms.Parent.IsRemote())
	a := attrMap(ms)
	require.Equal(t, "tools/call", a["mcp.method.name"])
	require.Equal(t, "append", a["gen_ai.tool.name"])
	require.Equal(t, "execute_tool", a["gen_ai.operation.name"])
	require.NotEmpty(t, a["jsonrpc.request.id"])
	require.NotContains(t, a, attribute.Key("error.type"))

	exec := tr.spansNamed("execute_tool fixture/append")
	require.Len(t, exec, 1)
	es := exec[0]
	require.Equal(t, ms.SpanContext.SpanID(), es.Parent.SpanID(), "execute_tool is under the MCP span")
	a = attrMap(es)
	require.Equal(t, "fixture/append", a["gen_ai.tool.name"])
	require.Equal(t, "acquired", a["toolfence.decision"])
	require.Equal(t, "succeeded", a["toolfence.outcome"])
	require.Equal(t, false, a["toolfence.replayed"])
	require.Equal(t, "mcp-proxy:fixture", a["toolfence.task"])
	require.Contains(t, a["toolfence.key"], "tf1_")
	for _, step := range []string{"reserve", "commit"} {
		steps := tr.spansNamed(step)
		require.Len(t, steps, 1, step)
		require.Equal(t, es.SpanContext.SpanID(), steps[0].Parent.SpanID(), "%s is under execute_tool", step)
	}
	for _, s := range tr.spans.GetSpans() {
		for _, kv := range s.Attributes {
			require.NotContains(t, kv.Value.String(), "secret-body", "span %s carries no argument", s.Name)
		}
	}

	tr.mu.Lock()
	require.Len(t, tr.metas, 1)
	got := tr.metas[0]
	tr.mu.Unlock()
	up, ok := got["traceparent"].(string)
	require.True(t, ok, "upstream's _meta has a traceparent: %v", got)
	upSC := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": up}))
	require.Equal(t, parent.TraceID(), upSC.TraceID(), "upstream's request is in the host's trace")
	require.Equal(t, es.SpanContext.SpanID(), upSC.SpanID(), "upstream's parent is the execute_tool span")
	require.Equal(t, "vendor=1", got["tracestate"], "tracestate passes on")

	// The same call again: replayed from the store, traced, nothing sent upstream.
	tr.spans.Reset()
	again := call(t, tr.host, "append", args, meta)
	require.Equal(t, true, again.Meta[mcpwire.MetaReplayed])
	exec = tr.spansNamed("execute_tool fixture/append")
	require.Len(t, exec, 1)
	require.Equal(t, true, attrMap(exec[0])["toolfence.replayed"])
	require.Equal(t, parent.TraceID(), exec[0].SpanContext.TraceID())
	tr.mu.Lock()
	require.Len(t, tr.metas, 1, "a replay sends nothing upstream")
	tr.mu.Unlock()
}

// TestProxyTracesBypassedAndAmbiguousCalls: a bypassed call gets the MCP span (child of the
// host's), ended when upstream's answer is relayed, and reaches upstream with the host's own
// _meta untouched; an isError answer without a no_effect rule marks the MCP span tool_error
// and the execute_tool span unknown_outcome, and logs one line with the key and the
// recovery but not the arguments.
func TestProxyTracesBypassedAndAmbiguousCalls(t *testing.T) {
	t.Parallel()
	tr := setupTraced(t)
	parent, meta := hostParent(t)

	res := call(t, tr.host, "read", map[string]any{}, meta)
	require.False(t, res.IsError, text(res))
	rs := tr.spansNamed("tools/call read")
	require.Len(t, rs, 1)
	require.Equal(t, parent.SpanID(), rs[0].Parent.SpanID())
	require.Empty(t, tr.spansNamed("execute_tool fixture/read"), "a bypassed call is not guarded")
	tr.mu.Lock()
	require.Equal(t, meta["traceparent"], tr.metas[0]["traceparent"], "a bypassed call is relayed untouched")
	tr.mu.Unlock()

	tr.mu.Lock()
	tr.isError = true
	tr.mu.Unlock()
	res = call(t, tr.host, "append", map[string]any{"target": "inbox:eve", "text": "secret-body"}, meta)
	require.True(t, res.IsError)
	ms := tr.spansNamed("tools/call append")
	require.Len(t, ms, 1)
	require.Equal(t, "tool_error", attrMap(ms[0])["error.type"])
	es := tr.spansNamed("execute_tool fixture/append")
	require.Len(t, es, 1)
	a := attrMap(es[0])
	require.Equal(t, "unknown_outcome", a["error.type"])
	require.Equal(t, "unknown_outcome", a["toolfence.violation"])
	require.Equal(t, "unknown", a["toolfence.outcome"])
	key := a["toolfence.key"].(string)

	logs := tr.logs.String()
	var lines []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, key) {
			lines = append(lines, l)
		}
	}
	require.Len(t, lines, 1, "one log line for the ambiguous call: %s", logs)
	require.Contains(t, lines[0], "level=WARN")
	require.Contains(t, lines[0], "kind=unknown_outcome")
	require.Contains(t, lines[0], "recovery=")
	require.NotContains(t, logs, "secret-body", "no arguments in the log")
	require.NotContains(t, logs, "appended", "no results in the log")
}
