// Package proxybench holds the MCP proxy's benchmarks (docs/benchmarks.md): one call over
// stdio to the payments MCP server directly, through `toolfence proxy` protected and bypassed.
// It has no code but its tests; they import mcpproxy, interceptor, ledger/badger and examples/payments.
package proxybench
