// Package payments is the fake payments MCP server of examples/mcp-proxy, the evals' proxy
// subject and the proxy benchmarks: tools charge, find_charge and list_charges over a Backend.
// It is public so that examples/mcp-proxy copied out of this repository still builds; it is a
// stand-in for a real payments API, not part of toolfence's API, with no compatibility promise.
// It imports the official Go SDK only; FileLedger is its offline backend (fsynced JSON lines).
package payments
