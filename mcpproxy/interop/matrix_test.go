package interop_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/mcpfixture"
)

// args is the one call most cells make.
var args = map[string]any{"target": "inbox:bob", "text": "hello"}

// requireReplayOf checks that second replays first: marked in _meta, a "[replayed]" note
// first, then first's own content.
func requireReplayOf(t *testing.T, first, second outcome) {
	t.Helper()
	require.False(t, first.IsError, first.text())
	require.False(t, first.Replayed)
	require.Equal(t, []string{"appended hello to inbox:bob"}, first.Texts, "the first answer is upstream's own")
	require.False(t, second.IsError, second.text())
	require.True(t, second.Replayed, "second call: %s", second.Raw)
	require.Len(t, second.Texts, 2)
	require.True(t, strings.HasPrefix(second.Texts[0], "[replayed] already done"), second.Texts[0])
	require.Equal(t, first.Texts, second.Texts[1:])
}

// TestRelayIsByteFaithful: what a host gets through the proxy for initialize, tools/list,
// resources (list, read) and prompts (list, get) is the upstream's answer, byte for byte,
// for both upstream SDKs.
func TestRelayIsByteFaithful(t *testing.T) {
	t.Parallel()
	reqs := []rawRequest{
		{"tools/list", `{}`},
		{"resources/list", `{}`},
		{"resources/read", `{"uri":"` + mcpfixture.ResourceURI + `"}`},
		{"prompts/list", `{}`},
		{"prompts/get", `{"name":"` + mcpfixture.PromptName + `","arguments":{"who":"Bob"}}`},
	}
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, "")
			want := w.rawSession(w.directArgv(), reqs...)
			got := w.rawSession(w.proxyArgv(w.store), reqs...)
			require.Len(t, got, len(want))
			for i := range want {
				name := "initialize"
				if i > 0 {
					name = reqs[i-1].method
				}
				require.Equal(t, string(want[i]), string(got[i]), name)
			}
			require.Contains(t, string(got[1]), `"readOnlyHint":true`)
			require.Contains(t, string(got[3]), mcpfixture.ResourceText)
			require.Contains(t, string(got[5]), "Say hello to Bob.")
			require.Empty(t, w.residuals(), "nothing of this touches the store")
		})
	}
}

// TestHostsSeeUpstreamToolsAndReplays: every host (official Go SDK, mcp-go) × every
// upstream (Go SDK, mcp-go) lists the tools as the upstream gives them and makes the same
// call twice: one effect, the second answer a replay.
func TestHostsSeeUpstreamToolsAndReplays(t *testing.T) {
	t.Parallel()
	for hk, newHost := range hostKinds {
		for _, fx := range fixtures {
			t.Run("host="+hk+"/upstream="+fx, func(t *testing.T) {
				t.Parallel()
				w := setup(t, fx, "")
				direct := newHost(w, w.directArgv())
				want := direct.tools(t)
				require.NoError(t, direct.close())

				h := newHost(w, w.proxyArgv(w.store))
				require.JSONEq(t, string(want), string(h.tools(t)))
				first := h.call(t, mcpfixture.ToolAppend, args, nil)
				second := h.call(t, mcpfixture.ToolAppend, args, nil)
				requireReplayOf(t, first, second)
				require.Equal(t, 1, w.effectCount())
				require.Equal(t, 1, w.dispatchCount())
			})
		}
	}
}

// TestTypeScriptHostSeesUpstreamToolsAndReplays: the same with a host on the official
// TypeScript SDK (testdata/tsclient/host.mjs), and the call replays again after a restart
// of host and proxy.
func TestTypeScriptHostSeesUpstreamToolsAndReplays(t *testing.T) {
	t.Parallel()
	nodeBin := node(t)
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, "")
			want, _ := w.tsRun(nodeBin, w.directArgv(), nil)
			call := tsCall{Name: mcpfixture.ToolAppend, Arguments: args}
			got, res := w.tsRun(nodeBin, w.proxyArgv(w.store), []tsCall{call, call})
			require.JSONEq(t, string(want), string(got))
			require.Len(t, res, 2)
			requireReplayOf(t, res[0], res[1])
			// A new host process and a new proxy on the same store: still a replay.
			_, again := w.tsRun(nodeBin, w.proxyArgv(w.store), []tsCall{call})
			requireReplayOf(t, res[0], again[0])
			require.Equal(t, 1, w.effectCount())
			require.Equal(t, 1, w.dispatchCount())
		})
	}
}
