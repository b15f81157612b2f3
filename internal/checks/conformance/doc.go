// Package conformance runs the official MCP conformance suite (npm
// @modelcontextprotocol/conformance) against `toolfence proxy` and `toolfence serve`, and
// compares the results check by check with the suite run directly against the go-sdk's
// reference server and client (docs/testing.md). It has no code but its tests; they run the
// built binaries and import internal/testkit, internal/testkit/npmci and the go-sdk.
package conformance
