// Package mcpfixture holds upstream MCP servers for tests of `toolfence proxy`: the same tools
// written once with the official Go SDK and once with mcp-go, whose mutating tool appends its
// effect to a file (fsynced) and misbehaves on demand. It imports no package of ours.
package mcpfixture
