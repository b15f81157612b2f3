package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpserver"
)

// traceFixture is a server whose interceptor reports to an in-memory span exporter, with a
// client connected over streamable HTTP.
type traceFixture struct {
	t     *testing.T
	spans *tracetest.InMemoryExporter
	c     *client.Client
}

func setupTracing(t *testing.T) *traceFixture {
	t.Helper()
	// The server reads _meta with the global propagator, which a program sets once (toolfence
	// serve sets W3C trace context); setting it here is harmless to other tests.
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	e := setupWith(t, interceptor.Options{TracerProvider: tp}, nil)
	return &traceFixture{t: t, spans: spans, c: e.dial(tokA, legacy)}
}

// call calls tool with traceparent (when not empty) in the request's _meta.
func (f *traceFixture) call(tool, traceparent string, args any) *mcp.CallToolResult {
	f.t.Helper()
	var req mcp.CallToolRequest
	req.Params.Name = tool
	req.Params.Arguments = args
	if traceparent != "" {
		req.Params.Meta = &mcp.Meta{AdditionalFields: map[string]any{"traceparent": traceparent, "tracestate": "rojo=00f067aa0ba902b7"}}
	}
	res, err := f.c.CallTool(ctx(f.t), req)
	require.NoError(f.t, err, "%s: protocol error", tool)
	return res
}

// span returns the one span named name.
func (f *traceFixture) span(name string) tracetest.SpanStub {
	f.t.Helper()
	var found []tracetest.SpanStub
	for _, s := range f.spans.GetSpans() {
		if s.Name == name {
			found = append(found, s)
		}
	}
	require.Len(f.t, found, 1, "spans named %q among %v", name, names(f.spans.GetSpans()))
	return found[0]
}

// child returns the one span named name whose parent is parent.
func (f *traceFixture) child(parent tracetest.SpanStub, name string) tracetest.SpanStub {
	f.t.Helper()
	for _, s := range f.spans.GetSpans() {
		if s.Name == name && s.Parent.SpanID() == parent.SpanContext.SpanID() {
			return s
		}
	}
	f.t.Fatalf("no span %q under %q among %v", name, parent.Name, names(f.spans.GetSpans()))
	return tracetest.SpanStub{}
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func spanAttrs(s tracetest.SpanStub) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value.String()
	}
	return m
}

const (
	agentTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	agentSpan  = "00f067aa0ba902b7"
)

// An MCP request carrying traceparent in _meta gets a SERVER span, named and annotated as
// the MCP semantic conventions say, that is a child of the agent's span; the guarded call's
// attributes are on the toolfence.begin_call span under it, with the ledger step below.
func TestMCPSpanIsChildOfMetaTraceparent(t *testing.T) {
	f := setupTracing(t)
	b := f.call(mcpserver.ToolBegin, fmt.Sprintf("00-%s-%s-01", agentTrace, agentSpan), m{
		"task": "run-1", "operation": "charge", "target": "invoice:INV-1", "args": m{"cents": 100},
	})
	require.False(t, b.IsError, text(b))
	var begun mcpserver.BeginResult
	require.NoError(t, json.Unmarshal(b.RawStructuredContent, &begun))

	srv := f.span("tools/call begin_call")
	require.Equal(t, trace.SpanKindServer, srv.SpanKind)
	require.Equal(t, agentTrace, srv.SpanContext.TraceID().String(), "the MCP span joins the agent's trace")
	require.Equal(t, agentSpan, srv.Parent.SpanID().String(), "as a child of the agent's span")
	require.True(t, srv.Parent.IsRemote())
	require.Equal(t, "rojo=00f067aa0ba902b7", srv.SpanContext.TraceState().String())
	a := spanAttrs(srv)
	require.Equal(t, "tools/call", a["mcp.method.name"])
	require.Equal(t, "begin_call", a["gen_ai.tool.name"])
	require.Equal(t, "execute_tool", a["gen_ai.operation.name"])
	require.Equal(t, "tcp", a["network.transport"])
	require.Equal(t, "http", a["network.protocol.name"])
	require.NotEmpty(t, a["jsonrpc.request.id"])
	require.NotEmpty(t, a["mcp.session.id"], "a legacy HTTP client has a session")
	require.NotContains(t, a, attribute.Key("error.type"))
	require.Equal(t, codes.Unset, srv.Status.Code)

	guarded := f.child(srv, "toolfence.begin_call")
	g := spanAttrs(guarded)
	require.Equal(t, "charge", g["gen_ai.tool.name"], "the interceptor names the guarded operation")
	require.Equal(t, "execute_tool", g["gen_ai.operation.name"])
	require.Equal(t, begun.Key, g["toolfence.key"])
	require.Equal(t, "run-1", g["toolfence.task"])
	require.Equal(t, "acquired", g["toolfence.decision"])
	require.Equal(t, "1", g["toolfence.attempt"])
	require.Equal(t, fmt.Sprint(begun.Token), g["toolfence.fencing_token"])
	reserve := f.child(guarded, "reserve")
	require.Equal(t, "badger", spanAttrs(reserve)["db.system.name"])
	for _, s := range f.spans.GetSpans() {
		require.NotContains(t, spanAttrs(s), attribute.Key("gen_ai.tool.call.arguments"), "no arguments in spans")
		for _, kv := range s.Attributes {
			require.NotContains(t, kv.Value.String(), begun.LeaseSecret, "no lease secret in span %s", s.Name)
		}
	}

	// The commit is another request of the same trace.
	const commitSpan = "b7ad6b7169203331"
	c := f.call(mcpserver.ToolCommit, fmt.Sprintf("00-%s-%s-01", agentTrace, commitSpan), m{
		"key": begun.Key, "token": begun.Token, "lease_secret": begun.LeaseSecret,
		"outcome": "succeeded", "result": m{"charge": "ch_1"}, "upstream_status": 201,
	})
	require.False(t, c.IsError, text(c))
	commit := f.span("tools/call commit_call")
	require.Equal(t, commitSpan, commit.Parent.SpanID().String())
	require.Equal(t, agentTrace, commit.SpanContext.TraceID().String())
	settled := spanAttrs(f.child(commit, "toolfence.commit_call"))
	require.Equal(t, "succeeded", settled["toolfence.outcome"])
	require.Equal(t, begun.Key, settled["toolfence.key"])
	require.Equal(t, "charge", settled["gen_ai.tool.name"])

	// A tool error (a stale commit) is error.type tool_error on the MCP span.
	stale := f.call(mcpserver.ToolCommit, "", m{
		"key": begun.Key, "token": begun.Token, "lease_secret": "0123456789abcdef0123456789abcdef",
		"outcome": "succeeded", "upstream_status": 201,
	})
	require.True(t, stale.IsError)
	var failed tracetest.SpanStub
	for _, s := range f.spans.GetSpans() {
		if s.Name == "tools/call commit_call" && s.SpanContext.SpanID() != commit.SpanContext.SpanID() {
			failed = s
		}
	}
	require.Equal(t, "tool_error", spanAttrs(failed)["error.type"])
	require.Equal(t, codes.Error, failed.Status.Code)
	require.False(t, failed.Parent.IsValid(), "without _meta or trace headers the span is a root")
	require.Equal(t, "lease_lost", spanAttrs(f.child(failed, "toolfence.commit_call"))["error.type"], "the barrier's span says why")

	// A protocol error is error.type = the JSON-RPC error code; other methods get spans too.
	var req mcp.CallToolRequest
	req.Params.Name = "no_such_tool"
	_, err := f.c.CallTool(ctx(t), req)
	require.Error(t, err)
	bad := spanAttrs(f.span("tools/call no_such_tool"))
	require.Regexp(t, `^-?\d+$`, bad["error.type"])
	require.Equal(t, bad["error.type"], bad["rpc.response.status_code"])
	_, err = f.c.ListTools(ctx(t), mcp.ListToolsRequest{})
	require.NoError(t, err)
	require.Equal(t, "tools/list", spanAttrs(f.span("tools/list"))["mcp.method.name"])
}

// Over stdio the span says network.transport=pipe, and _meta still gives the parent.
func TestMCPSpanOverStdio(t *testing.T) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	e := setupWith(t, interceptor.Options{TracerProvider: tp}, nil)
	toServer, clientOut := io.Pipe()
	clientIn, fromServer := io.Pipe()
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- e.srv.ServeStdio(sctx, "", toServer, fromServer) }()
	t.Cleanup(func() {
		stop()
		clientOut.Close()
		fromServer.Close()
		<-served
	})
	c := start(t, client.NewClient(transport.NewIO(clientIn, clientOut, io.NopCloser(strings.NewReader(""))), client.WithProtocolVersion(legacy)), legacy)
	f := &traceFixture{t: t, spans: spans, c: c}
	res := f.call(mcpserver.ToolListPending, fmt.Sprintf("00-%s-%s-01", agentTrace, agentSpan), m{})
	require.False(t, res.IsError, text(res))
	s := f.span("tools/call list_pending")
	require.Equal(t, "pipe", spanAttrs(s)["network.transport"])
	require.NotContains(t, spanAttrs(s), attribute.Key("network.protocol.name"))
	require.Equal(t, agentSpan, s.Parent.SpanID().String())
}
