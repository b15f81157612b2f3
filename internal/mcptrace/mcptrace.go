// Package mcptrace is what toolfence's two MCP surfaces (mcpserver, mcpproxy) share of the
// OpenTelemetry MCP semantic conventions: span attribute keys, span names, and W3C trace
// context carried in a request's params._meta. It imports only OpenTelemetry.
package mcptrace

import (
	"context"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
)

// Span attributes of the OpenTelemetry MCP semantic conventions.
const (
	AttrMethod      = attribute.Key("mcp.method.name")
	AttrSession     = attribute.Key("mcp.session.id")
	AttrProtocol    = attribute.Key("mcp.protocol.version")
	AttrResourceURI = attribute.Key("mcp.resource.uri")
	AttrPromptName  = attribute.Key("gen_ai.prompt.name")
	AttrRequestID   = attribute.Key("jsonrpc.request.id")
	AttrRPCStatus   = attribute.Key("rpc.response.status_code")
	AttrTransport   = attribute.Key("network.transport")
	AttrNetProtocol = attribute.Key("network.protocol.name")
)

// ToolError is the error.type of an MCP span whose tool result has isError: true.
const ToolError = "tool_error"

// SpanName is the name of an MCP request's span: "{method} {target}" (tools/call send_email,
// prompts/get reconcile_task), or the method alone when target is empty.
func SpanName(method, target string) string {
	if target == "" {
		return method
	}
	return method + " " + target
}

// RequestID renders a JSON-RPC request id (a string or a number, as JSON decodes it) as the
// value of jsonrpc.request.id. It returns false for nil (a notification has no id).
func RequestID(id any) (string, bool) {
	switch id := id.(type) {
	case nil:
		return "", false
	case string:
		return id, true
	case float64:
		return strconv.FormatFloat(id, 'f', -1, 64), true
	default:
		return fmt.Sprint(id), true
	}
}

// Extract returns ctx carrying the remote span context that meta (a request's params._meta)
// holds in the fields of the global propagator (otel.GetTextMapPropagator(): traceparent,
// tracestate with W3C trace context), so that a span started from it is the caller's child.
// Fields that are not strings are ignored; without any, ctx is returned as it is.
func Extract(ctx context.Context, meta map[string]any) context.Context {
	if len(meta) == 0 {
		return ctx
	}
	p := otel.GetTextMapPropagator()
	carrier := propagation.MapCarrier{}
	for _, f := range p.Fields() {
		if v, ok := meta[f].(string); ok {
			carrier[f] = v
		}
	}
	if len(carrier) == 0 {
		return ctx
	}
	return p.Extract(ctx, carrier)
}

// Inject writes the trace context of ctx into meta with the global propagator and returns
// meta: a new map when meta is nil and there is something to write, meta untouched when
// there is nothing (no span in ctx, or the no-op propagator).
func Inject(ctx context.Context, meta map[string]any) map[string]any {
	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	if len(carrier) == 0 {
		return meta
	}
	if meta == nil {
		meta = map[string]any{}
	}
	for k, v := range carrier {
		meta[k] = v
	}
	return meta
}
