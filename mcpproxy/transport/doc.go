// Package transport carries the proxy's JSON-RPC: the stdio line framing (Stdio), a command upstream in its own process group (StartUpstream), a streamable-HTTP upstream (HTTPUpstream) and one upstream shared by many stateless connections (Mux), all mcp.Connections that relay messages and decide nothing.
//
// It imports nothing of the module: only the jsonrpc package and mcp.Connection of the official Go SDK, x/net's httpguts and x/sys/unix.
package transport
