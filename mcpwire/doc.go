// Package mcpwire is what toolfence's two MCP surfaces, the ledger server (mcpserver) and the
// guarding proxy (mcpproxy), put on the wire alike: error details and violation views, their
// kinds, the _meta keys, bearer tokens and the bind check, the endpoint path and the default
// request limits.
//
// The name says the rule of the package: only what is visible on the MCP wire and must read
// the same from both surfaces, and no MCP SDK, so neither surface pulls in the other's SDK and
// a change here is a change of both wire outputs. It imports interceptor and residual.
package mcpwire
