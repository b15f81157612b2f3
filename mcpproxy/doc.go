// Package mcpproxy guards any MCP server: it relays JSON-RPC between a host and an upstream server and puts every mutating tools/call through the interceptor's barrier (Begin, then Report).
// It imports interceptor, tools (observation texts, targets, JSON pointers), mcpserver (wire views) and internal/mcptrace (MCP span conventions), the OpenTelemetry API, go.yaml.in/yaml/v3 (YAML policies) and only the transports and jsonrpc package of the official Go SDK.
package mcpproxy
