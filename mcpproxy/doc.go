// Package mcpproxy guards any MCP server: it relays JSON-RPC between a host and an upstream server and puts every mutating tools/call through the interceptor's barrier (Begin, then Report).
// It imports interceptor, tools (observation texts, targets), mcpserver (wire views) and internal/mcptrace (MCP span conventions), the OpenTelemetry API, and only the transports and jsonrpc package of the official Go SDK.
package mcpproxy
