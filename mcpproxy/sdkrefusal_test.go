package mcpproxy_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/residual"
)

// An isError result in an MCP SDK's words for a call refused before the tool ran is failed
// (no effect): the key stays free and the same call is dispatched again. Another isError
// text stays unknown, and the host's answer says the server answered an error that may
// have acted, then gives upstream's content.
func TestProxySDKRefusalsAreNoEffect(t *testing.T) {
	for _, text := range []string{
		"MCP error -32602: Invalid arguments for tool charge: amount: Required",             // TypeScript
		"MCP error -32601: Tool charge not found",                                           // TypeScript
		`validating "arguments": validating root: required: missing properties: ["amount"]`, // Go SDK
		"Input validation error: 'amount' is a required property",                           // Python SDK
	} {
		t.Run(text, func(t *testing.T) {
			r := newRig(t, mcpproxy.Options{}, nil)
			isErr, _ := json.Marshal(map[string]any{"isError": true, "content": []any{map[string]any{"type": "text", "text": text}}})
			for i := range 2 {
				r.host.send(t, float64(i+1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
				if i == 0 {
					r.listed(t, chargeDef)
				}
				call := r.up.nextReq(t)
				require.Equal(t, "tools/call", call.Method, "attempt %d is dispatched", i+1)
				r.up.answer(t, call.ID, string(isErr))
				var got struct {
					IsError bool `json:"isError"`
					Content []struct {
						Text string `json:"text"`
					} `json:"content"`
				}
				require.NoError(t, json.Unmarshal([]byte(r.hostResult(t, i+1)), &got))
				require.True(t, got.IsError)
				require.Equal(t, text, got.Content[0].Text, "upstream's answer, as it gave it")
			}
			rs := r.residuals(t)
			require.Len(t, rs, 1)
			require.Equal(t, residual.Failed, rs[0].State)
			require.Len(t, rs[0].Attempts, 2)
		})
	}
	t.Run("other text", func(t *testing.T) {
		r := newRig(t, mcpproxy.Options{}, nil)
		r.host.send(t, float64(1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
		r.listed(t, chargeDef)
		call := r.up.nextReq(t)
		r.up.answer(t, call.ID, `{"isError":true,"content":[{"type":"text","text":"charge failed: MCP error -32602: late"}]}`)
		// The first answer says truthfully what happened, and keeps upstream's own words.
		got := r.hostResult(t, 1)
		require.Contains(t, got, "the server answered an error; toolfence cannot tell whether it acted")
		require.Contains(t, got, "charge failed: MCP error -32602: late")
		rs := r.residuals(t)
		require.Len(t, rs, 1)
		require.Equal(t, residual.Unknown, rs[0].State)
	})
}
