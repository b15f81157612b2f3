package interop_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/fixture/mcpfixture"
)

// args is the one call most cells make.
var args = map[string]any{"target": "inbox:bob", "text": "hello"}

// args2 is a second call, on another target.
var args2 = map[string]any{"target": "inbox:carol", "text": "hi"}

// requireUnknownThenRefused checks an ambiguous answer (isError after the effect, no
// no_effect rule) and the refusal of the same call after it, as a host sees them: isError
// results with the observation text and _meta kind unknown_outcome.
func requireUnknownThenRefused(t *testing.T, ambiguous, retry outcome) {
	t.Helper()
	require.True(t, ambiguous.IsError, ambiguous.Raw)
	require.Equal(t, kindUnknown, ambiguous.Kind, "%s", ambiguous.Raw)
	require.Contains(t, ambiguous.text(), "outcome unknown; do not retry")
	require.Equal(t, "boom after the write", ambiguous.Texts[len(ambiguous.Texts)-1], "upstream's own text follows the observation")
	require.True(t, retry.IsError, retry.Raw)
	require.Equal(t, kindUnknown, retry.Kind, "%s", retry.Raw)
	require.Contains(t, retry.text(), "blocked: a previous attempt may have reached the upstream of append")
}

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
	require.True(t, strings.HasPrefix(second.Texts[0], "[replayed] not sent"), second.Texts[0])
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
// call twice: one effect, the second answer a replay. An ambiguous answer and the refusal
// after it reach the host as isError results with the proxy's _meta details.
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
				requireUnknownThenRefused(t, h.call(t, mcpfixture.ToolAppend, args2, mode(mcpfixture.ModeIsError)),
					h.call(t, mcpfixture.ToolAppend, args2, nil))
				require.Equal(t, 2, w.effectCount())
				require.Equal(t, 2, w.dispatchCount())
			})
		}
	}
}

// TestTypeScriptHostSeesUpstreamToolsAndReplays: the same with a host on the official
// TypeScript SDK (internal/fixture/testdata/tsclient/host.mjs), and the call replays again after a restart
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
			got, res := w.tsRun(nodeBin, w.proxyArgv(w.store), []tsCall{call, call,
				{Name: mcpfixture.ToolAppend, Arguments: args2, Meta: mode(mcpfixture.ModeIsError)},
				{Name: mcpfixture.ToolAppend, Arguments: args2}})
			require.JSONEq(t, string(want), string(got))
			require.Len(t, res, 4)
			requireReplayOf(t, res[0], res[1])
			requireUnknownThenRefused(t, res[2], res[3])
			// A new host process and a new proxy on the same store: still a replay.
			_, again := w.tsRun(nodeBin, w.proxyArgv(w.store), []tsCall{call})
			requireReplayOf(t, res[0], again[0])
			require.Equal(t, 2, w.effectCount())
			require.Equal(t, 2, w.dispatchCount())
		})
	}
}
