// Package mcpserver serves the toolfence ledger over the Model Context Protocol: tools for
// successor agents (list, inspect, resolve, reconcile) and the guard protocol for any MCP agent.
//
// It imports residual, lease, ledger, interceptor, mcpwire (wire vocabulary), internal/httpserve
// and internal/mcptrace, and mcp-go; only the wiring imports it.
package mcpserver
