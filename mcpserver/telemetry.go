package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/mark3labs/mcp-go/tracing"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolfence/toolfence/interceptor"
)

// Span attributes of the OpenTelemetry MCP semantic conventions.
const (
	attrMethod      = attribute.Key("mcp.method.name")
	attrSession     = attribute.Key("mcp.session.id")
	attrProtocol    = attribute.Key("mcp.protocol.version")
	attrResourceURI = attribute.Key("mcp.resource.uri")
	attrPromptName  = attribute.Key("gen_ai.prompt.name")
	attrRequestID   = attribute.Key("jsonrpc.request.id")
	attrRPCStatus   = attribute.Key("rpc.response.status_code")
	attrTransport   = attribute.Key("network.transport")
	attrNetProtocol = attribute.Key("network.protocol.name")
)

// barrierTools are the tools whose handlers call the interceptor's Begin, Resume or Report:
// each gets an internal span "toolfence.{tool}" under the MCP span, on which the
// interceptor sets the guarded call's gen_ai.* and toolfence.* attributes (the MCP span's
// gen_ai.tool.name stays the MCP tool's name).
var barrierTools = map[string]bool{ToolBegin: true, ToolCommit: true, ToolRenew: true}

// mcpTracing makes one SERVER span per MCP request following the OpenTelemetry MCP semantic
// conventions: named "{mcp.method.name} {target}" (tools/call begin_call, prompts/get
// reconcile_task) or "{mcp.method.name}", with mcp.method.name, mcp.session.id,
// mcp.protocol.version, jsonrpc.request.id, gen_ai.tool.name and gen_ai.operation.name
// (tools/call), gen_ai.prompt.name, mcp.resource.uri, network.transport and error.type (the
// JSON-RPC error code, or tool_error for a result with isError). Its parent is the trace
// context in the request's params._meta (traceparent, tracestate), read with the global
// propagator (otel.GetTextMapPropagator()); without one, a span already in the context,
// or else the HTTP request's headers. A transport context that is not the parent is
// linked. It plugs into mcp-go as its Tracer, Propagator and MetaPropagator.
type mcpTracing struct {
	tracer trace.Tracer
}

// withTracing installs the MCP spans on an mcp-go server: the tracer and propagators, the
// hooks that name and annotate each span, and the tool middleware (outermost of those
// listed after it) that marks tool errors and opens the barrier tools' spans.
func (sp *space) withTracing(hooks *server.Hooks) server.ServerOption {
	tp := sp.ic.Settings().TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	t := &mcpTracing{tracer: tp.Tracer(interceptor.ScopeName)}
	hooks.AddBeforeAny(t.beforeAny)
	hooks.AddOnError(t.onError)
	opts := []server.ServerOption{
		server.WithToolHandlerMiddleware(t.tool),
		server.WithTracer(t), server.WithPropagator(t), server.WithMetaPropagator(t),
	}
	return func(s *server.MCPServer) {
		for _, o := range opts {
			o(s)
		}
	}
}

// withStdio marks ctx as the context of a stdio connection (network.transport = pipe).
func withStdio(ctx context.Context) context.Context {
	return context.WithValue(ctx, transportKey{}, "pipe")
}

type (
	transportKey struct{}
	parentsKey   struct{}
)

// parents is what the propagators found for one request: whether the parent came from
// _meta, and the other contexts to link.
type parents struct {
	fromMeta bool
	links    []trace.SpanContext
}

func propagator() propagation.TextMapPropagator { return otel.GetTextMapPropagator() }

// ExtractMeta makes the trace context in a request's params._meta the parent of its span;
// a span context that was in ctx already (the transport's) is linked.
func (t *mcpTracing) ExtractMeta(ctx context.Context, meta *mcp.Meta) context.Context {
	if meta == nil || len(meta.AdditionalFields) == 0 {
		return ctx
	}
	p := propagator()
	carrier := propagation.MapCarrier{}
	for _, f := range p.Fields() {
		if v, ok := meta.AdditionalFields[f].(string); ok {
			carrier[f] = v
		}
	}
	if len(carrier) == 0 {
		return ctx
	}
	ambient := trace.SpanContextFromContext(ctx)
	out := p.Extract(ctx, carrier)
	sc := trace.SpanContextFromContext(out)
	if !sc.IsValid() || sc.Equal(ambient) {
		return out
	}
	ps := &parents{fromMeta: true}
	if ambient.IsValid() {
		ps.links = append(ps.links, ambient)
	}
	return context.WithValue(out, parentsKey{}, ps)
}

// InjectMeta writes the trace context of ctx into meta. It completes mcp-go's MetaPropagator;
// mcp-go's server does not call it today.
func (t *mcpTracing) InjectMeta(ctx context.Context, meta *mcp.Meta) *mcp.Meta {
	carrier := propagation.MapCarrier{}
	propagator().Inject(ctx, carrier)
	if len(carrier) == 0 {
		return meta
	}
	if meta == nil {
		meta = &mcp.Meta{}
	}
	if meta.AdditionalFields == nil {
		meta.AdditionalFields = map[string]any{}
	}
	for k, v := range carrier {
		meta.AdditionalFields[k] = v
	}
	return meta
}

// Extract reads the transport's trace context from HTTP headers: the parent when neither
// _meta nor ctx has one, a link when _meta gave the parent. It also notes that the request
// came over HTTP.
func (t *mcpTracing) Extract(ctx context.Context, headers http.Header) context.Context {
	if len(headers) == 0 {
		return ctx
	}
	ctx = context.WithValue(ctx, transportKey{}, "tcp")
	p := propagator()
	if ps, ok := ctx.Value(parentsKey{}).(*parents); ok && ps.fromMeta {
		if sc := trace.SpanContextFromContext(p.Extract(context.Background(), propagation.HeaderCarrier(headers))); sc.IsValid() {
			ps.links = append(ps.links, sc)
		}
		return ctx
	}
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	return p.Extract(ctx, propagation.HeaderCarrier(headers))
}

// Inject writes the trace context of ctx into HTTP headers. It completes mcp-go's
// Propagator; mcp-go's server does not call it today.
func (t *mcpTracing) Inject(ctx context.Context, headers http.Header) {
	propagator().Inject(ctx, propagation.HeaderCarrier(headers))
}

// Start opens the span of one MCP request (mcp-go names it "mcp.{method}"). mcp-go's
// per-tool span ("tool.{name}") is not made: the interceptor makes the guarded call's spans.
func (t *mcpTracing) Start(ctx context.Context, name string, _ tracing.SpanKind, attrs ...tracing.Attribute) (context.Context, tracing.Span) {
	method, ok := strings.CutPrefix(name, "mcp.")
	if !ok {
		return ctx, noSpan{}
	}
	kv := []attribute.KeyValue{attrMethod.String(method)}
	switch ctx.Value(transportKey{}) {
	case "tcp":
		kv = append(kv, attrTransport.String("tcp"), attrNetProtocol.String("http"))
	case "pipe":
		kv = append(kv, attrTransport.String("pipe"))
	}
	for _, a := range attrs {
		switch a.Key {
		case "mcp.session.id":
			kv = append(kv, attrSession.String(a.Value))
		case "mcp.protocol.version":
			kv = append(kv, attrProtocol.String(a.Value))
		}
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(kv...)}
	if ps, ok := ctx.Value(parentsKey{}).(*parents); ok {
		for _, l := range ps.links {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: l}))
		}
	}
	ctx, span := t.tracer.Start(ctx, method, opts...)
	s := &mcpSpan{span: span, method: method}
	return tracing.ContextWithSpan(ctx, s), s
}

// beforeAny names the span after its target and records the request id.
func (t *mcpTracing) beforeAny(ctx context.Context, id any, _ mcp.MCPMethod, message any) {
	s := spanOf(ctx)
	if s == nil || !s.span.IsRecording() {
		return
	}
	s.requestID(id)
	switch m := message.(type) {
	case *mcp.CallToolRequest:
		s.span.SetName(s.method + " " + m.Params.Name)
		s.span.SetAttributes(interceptor.AttrToolName.String(m.Params.Name), interceptor.AttrOperationName.String("execute_tool"))
	case *mcp.GetPromptRequest:
		s.span.SetName(s.method + " " + m.Params.Name)
		s.span.SetAttributes(attrPromptName.String(m.Params.Name))
	case *mcp.ReadResourceRequest:
		s.span.SetAttributes(attrResourceURI.String(m.Params.URI))
	case *mcp.SubscribeRequest:
		s.span.SetAttributes(attrResourceURI.String(m.Params.URI))
	case *mcp.UnsubscribeRequest:
		s.span.SetAttributes(attrResourceURI.String(m.Params.URI))
	}
}

// onError records a JSON-RPC error's code as error.type and rpc.response.status_code.
func (t *mcpTracing) onError(ctx context.Context, id any, _ mcp.MCPMethod, _ any, err error) {
	s := spanOf(ctx)
	if s == nil {
		return
	}
	s.requestID(id)
	var rpc interface{ ToJSONRPCError() mcp.JSONRPCError }
	if !errors.As(err, &rpc) {
		s.fail("_OTHER", "")
		return
	}
	code := strconv.Itoa(rpc.ToJSONRPCError().Error.Code)
	s.span.SetAttributes(attrRPCStatus.String(code))
	s.fail(code, "")
}

// tool opens the barrier tools' spans and marks a tool result with isError as tool_error.
func (t *mcpTracing) tool(next server.ToolHandlerFunc) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		s := spanOf(ctx)
		if s != nil && barrierTools[req.Params.Name] && s.span.IsRecording() {
			var span trace.Span
			ctx, span = t.tracer.Start(ctx, "toolfence."+req.Params.Name, trace.WithSpanKind(trace.SpanKindInternal))
			defer span.End()
		}
		res, err := next(ctx, req)
		if s != nil && err == nil && res != nil && res.IsError {
			s.fail("tool_error", "tool returned an error result")
		}
		return res, err
	}
}

// spanOf returns the MCP span of ctx, or nil.
func spanOf(ctx context.Context) *mcpSpan {
	s, _ := tracing.SpanFromContext(ctx).(*mcpSpan)
	return s
}

// mcpSpan is the span of one MCP request, as mcp-go's tracing.Span.
type mcpSpan struct {
	span   trace.Span
	method string

	mu     sync.Mutex
	failed bool
	typed  bool // error.type is set
}

// requestID sets jsonrpc.request.id (not for notifications, whose id is nil).
func (s *mcpSpan) requestID(id any) {
	if r, ok := id.(mcp.RequestId); ok {
		id = r.Value()
	}
	var v string
	switch id := id.(type) {
	case nil:
		return
	case string:
		v = id
	case float64:
		v = strconv.FormatFloat(id, 'f', -1, 64)
	default:
		v = fmt.Sprint(id)
	}
	s.span.SetAttributes(attrRequestID.String(v))
}

// fail sets error.type (the first one set wins) and the Error status.
func (s *mcpSpan) fail(errorType, desc string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.typed {
		s.span.SetAttributes(interceptor.AttrErrorType.String(errorType))
		s.typed = true
	}
	if !s.failed || desc != "" {
		s.span.SetStatus(codes.Error, desc)
	}
	s.failed = true
}

// SetAttributes is a no-op: the span's attributes are set from the request itself.
func (s *mcpSpan) SetAttributes(...tracing.Attribute) {}

// RecordError is a no-op: error texts may quote arguments, and error.type says what failed.
func (s *mcpSpan) RecordError(error) {}

// SetStatus marks the span failed with mcp-go's description (the JSON-RPC error message).
func (s *mcpSpan) SetStatus(code tracing.StatusCode, desc string) {
	if code != tracing.StatusError {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.span.SetStatus(codes.Error, desc)
	s.failed = true
}

// End ends the span; a failed span without an error.type gets "_OTHER".
func (s *mcpSpan) End() {
	s.mu.Lock()
	if s.failed && !s.typed {
		s.span.SetAttributes(interceptor.AttrErrorType.String("_OTHER"))
	}
	s.mu.Unlock()
	s.span.End()
}

// noSpan is the span mcp-go gets for what toolfence does not trace itself.
type noSpan struct{}

func (noSpan) SetAttributes(...tracing.Attribute)   {}
func (noSpan) RecordError(error)                    {}
func (noSpan) SetStatus(tracing.StatusCode, string) {}
func (noSpan) End()                                 {}
