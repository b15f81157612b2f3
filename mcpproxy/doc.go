// Package mcpproxy guards any MCP server: it relays JSON-RPC between a host and an upstream server and puts every mutating tools/call through the interceptor's barrier (Begin, then Report).
//
// It imports residual, lease, interceptor (barrier and observation texts), jsonptr (targets),
// mcpwire (wire vocabulary), internal/httpserve (HTTP limits) and internal/mcptrace (MCP span
// conventions), the OpenTelemetry API, the YAML v3 package (policies) and only the transports
// and jsonrpc package of the official Go SDK; no other adapter, langchaingo or mcp-go.
package mcpproxy
