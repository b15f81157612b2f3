// Package transport carries the proxy's JSON-RPC: the stdio line framing (Stdio), a command upstream in its own process group (StartUpstream) and a streamable-HTTP upstream (HTTPUpstream), each an mcp.Connection that relays messages and decides nothing.
//
// It imports nothing of the module: only the jsonrpc package and mcp.Connection of the official Go SDK, x/net's httpguts and x/sys/unix.
package transport
