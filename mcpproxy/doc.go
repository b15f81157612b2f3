// Package mcpproxy guards any MCP server: it relays JSON-RPC between a host and an upstream server and puts every mutating tools/call through the interceptor's barrier (Begin, then Report); mcpproxy/policy says which calls and how, mcpproxy/transport carries the messages.
//
// It imports residual, lease, ledger (to read a residual), interceptor (barrier and observation texts), jsonptr (targets),
// mcpwire (wire vocabulary), mcpproxy/policy (the policy language), mcpproxy/transport (stdio,
// command and HTTP upstreams), internal/httpserve (HTTP limits) and internal/mcptrace (MCP span
// conventions), the OpenTelemetry API and only the transports and jsonrpc package of the
// official Go SDK; no other adapter, langchaingo or mcp-go.
package mcpproxy
