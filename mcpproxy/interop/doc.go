// Package interop holds the interoperability and failure tests of `toolfence proxy`: the real
// binary between the MCP hosts users run (official Go SDK, mcp-go, TypeScript SDK) and
// upstream servers written with the official Go SDK and mcp-go (internal/fixture/mcpfixture), and
// the MCP reference servers server-filesystem and server-memory (pinned in
// internal/fixture/testdata/tsclient). It has no code of its own; see its tests.
package interop
