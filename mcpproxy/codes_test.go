package mcpproxy

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// TestErrorCodesLeaveMCPsRange: every JSON-RPC error code the proxy makes is one of
// JSON-RPC's own (−32700, −32600, −32601) or in −32000…−32019, never in −32020…−32099,
// which MCP 2026-07-28 reserves (docs/proxy.md lists them).
func TestErrorCodesLeaveMCPsRange(t *testing.T) {
	t.Parallel()
	standard := map[int64]bool{jsonrpc.CodeParseError: true, jsonrpc.CodeInvalidRequest: true, jsonrpc.CodeMethodNotFound: true}
	for name, code := range map[string]int64{
		"codeInvalidRequest": codeInvalidRequest, "codeBusy": codeBusy, "transport.CodeUpstreamHTTP": transport.CodeUpstreamHTTP,
	} {
		if standard[code] {
			continue
		}
		require.True(t, code >= -32019 && code <= -32000, "%s = %d", name, code)
	}
}
