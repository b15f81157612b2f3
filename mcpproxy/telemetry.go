package mcpproxy

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/mcptrace"
)

// tracer returns the tracer of the proxy's spans: the interceptor's TracerProvider, else the
// global one (no spans until the program installs the SDK).
func tracer(ic *interceptor.Interceptor) trace.Tracer {
	tp := ic.Settings().TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(interceptor.ScopeName)
}

// startCall opens the SERVER span of one tools/call from the host, following the MCP
// semantic conventions as the MCP server does: "tools/call {tool}" with mcp.method.name,
// jsonrpc.request.id, gen_ai.tool.name (the upstream's tool) and gen_ai.operation.name. Its
// parent is the trace context in the request's params._meta (traceparent, tracestate; the
// global propagator reads them).
func (p *Proxy) startCall(ctx context.Context, id jsonrpc.ID, params callParams) (context.Context, trace.Span) {
	if p.ic.TracesOff() {
		return ctx, offSpan // the host's trace context, if any, reaches upstream in the params as sent
	}
	ctx = mcptrace.Extract(ctx, metaStrings(params.Meta))
	ctx, span := p.tracer.Start(ctx, mcptrace.SpanName("tools/call", params.Name), trace.WithSpanKind(trace.SpanKindServer))
	if span.IsRecording() {
		span.SetAttributes(mcptrace.AttrMethod.String("tools/call"))
		if v, ok := mcptrace.RequestID(id.Raw()); ok {
			span.SetAttributes(mcptrace.AttrRequestID.String(v))
		}
		if params.Name != "" {
			span.SetAttributes(interceptor.AttrToolName.String(params.Name), interceptor.AttrOperationName.String("execute_tool"))
		}
	}
	return ctx, span
}

// offSpan is the span of every call while traces are off: no-op, allocated once.
var offSpan = trace.SpanFromContext(context.Background())

// startSpan starts a span, or returns ctx and offSpan without allocating while traces are
// off (Interceptor.TracesOff).
func (p *Proxy) startSpan(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if p.ic.TracesOff() {
		return ctx, offSpan
	}
	return p.tracer.Start(ctx, name, opts...)
}

// endCall ends the span of a tools/call with the answer the host got: error.type is the
// JSON-RPC error code (and rpc.response.status_code), or tool_error for a result with
// isError, or "_OTHER" when no answer came (resp nil).
func endCall(span trace.Span, resp *jsonrpc.Response) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	fail := func(errorType, desc string) {
		span.SetAttributes(interceptor.AttrErrorType.String(errorType))
		span.SetStatus(codes.Error, desc)
	}
	switch {
	case resp == nil:
		fail("_OTHER", "no answer from upstream")
	case resp.Error != nil:
		var we *jsonrpc.Error
		if !errors.As(resp.Error, &we) {
			fail("_OTHER", resp.Error.Error())
			return
		}
		code := strconv.FormatInt(we.Code, 10)
		span.SetAttributes(mcptrace.AttrRPCStatus.String(code))
		fail(code, we.Message)
	default:
		var r struct {
			IsError bool `json:"isError"`
		}
		if json.Unmarshal(resp.Result, &r) == nil && r.IsError {
			fail(mcptrace.ToolError, "tool returned an error result")
		}
	}
}

// metaStrings returns the string fields of a request's _meta (the only kind a trace
// context field can be).
func metaStrings(meta map[string]json.RawMessage) map[string]any {
	var out map[string]any
	for k, raw := range meta {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			if out == nil {
				out = map[string]any{}
			}
			out[k] = s
		}
	}
	return out
}

// withTraceContext returns tools/call params with the trace context of ctx written into
// their _meta (traceparent, tracestate, replacing the host's), the other fields as they
// were. The params come back unchanged when there is nothing to write or they are not a
// JSON object.
func withTraceContext(ctx context.Context, params json.RawMessage) json.RawMessage {
	fields := mcptrace.Inject(ctx, nil)
	if len(fields) == 0 {
		return params
	}
	var doc map[string]json.RawMessage
	if json.Unmarshal(params, &doc) != nil || doc == nil {
		return params
	}
	var meta map[string]json.RawMessage
	if raw, ok := doc["_meta"]; ok && json.Unmarshal(raw, &meta) != nil {
		return params
	}
	if meta == nil {
		meta = map[string]json.RawMessage{}
	}
	for k, v := range fields {
		meta[k], _ = json.Marshal(v)
	}
	doc["_meta"], _ = json.Marshal(meta)
	out, err := json.Marshal(doc)
	if err != nil {
		return params
	}
	return out
}
