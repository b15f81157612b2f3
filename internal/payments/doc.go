// Package payments is the fake payments MCP server of examples/mcp-proxy, the evals' proxy
// subject and the proxy benchmarks: tools charge, find_charge and list_charges over a Backend.
// It imports the official Go SDK only; FileLedger is its offline backend (fsynced JSON lines).
package payments
