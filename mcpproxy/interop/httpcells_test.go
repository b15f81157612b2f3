package interop_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/fixture/mcpfixture"
	"github.com/toolfence/toolfence/residual"
)

// Tokens of the HTTP cells (at least 16 bytes), each in its namespace.
const (
	tokenA = "token-of-team-a-0123456789"
	tokenB = "token-of-team-b-0123456789"
)

// httpHostKinds are the hosts that reach a proxy served over --http.
var httpHostKinds = map[string]func(w *world, url, token string) host{
	"gosdk": func(w *world, url, token string) host { return w.goSDKHTTP(url, token) },
	"mcpgo": func(w *world, url, token string) host { return w.mcpGoHTTP(url, token, "") },
}

// httpProxy starts `toolfence proxy --http 127.0.0.1:0 --token-file F` (tokenA in namespace
// team-a, tokenB in team-b) in front of the fixture (a child per host session) on store and
// returns its MCP URL.
func (w *world) httpProxy(store string) string {
	w.t.Helper()
	tokens := filepath.Join(w.dir, "tokens")
	require.NoError(w.t, os.WriteFile(tokens, []byte(tokenA+" team-a\n"+tokenB+" team-b\n"), 0o600))
	argv := w.proxyArgv(store)
	dash := len(argv) - 3 // "--", fxBin, fixture
	argv = append(append(append([]string{}, argv[:dash]...), "--http", "127.0.0.1:0", "--token-file", tokens), argv[dash:]...)
	return w.startServing(exec.Command(argv[0], argv[1:]...), true, regexp.MustCompile(`serving MCP at (http://\S+)`))
}

// upstreamProxyArgv is the command of a proxy on stdio in front of the fixture served over
// HTTP at url (--upstream).
func (w *world) upstreamProxyArgv(store, url string) []string {
	argv := w.proxyArgv(store)
	return append(argv[:len(argv)-3], "--upstream", url)
}

// TestHTTPHostsSeeUpstreamToolsAndReplays: Go SDK and mcp-go hosts over streamable HTTP to
// `toolfence proxy --http` × both upstreams (stdio children): the tool list is the one the
// same host gets from the upstream directly, and the same call twice is one effect and a
// replay, also from a second session (a new upstream child).
func TestHTTPHostsSeeUpstreamToolsAndReplays(t *testing.T) {
	t.Parallel()
	for hk, newHost := range httpHostKinds {
		for _, fx := range fixtures {
			t.Run("host="+hk+"/upstream="+fx, func(t *testing.T) {
				t.Parallel()
				w := setup(t, fx, "")
				direct := hostKinds[hk](w, w.directArgv())
				want := direct.tools(t)
				require.NoError(t, direct.close())

				url := w.httpProxy(w.store)
				h := newHost(w, url, tokenA)
				require.JSONEq(t, string(want), string(h.tools(t)))
				first := h.call(t, mcpfixture.ToolAppend, args, nil)
				requireReplayOf(t, first, h.call(t, mcpfixture.ToolAppend, args, nil))
				require.NoError(t, h.close())
				again := newHost(w, url, tokenA)
				requireReplayOf(t, first, again.call(t, mcpfixture.ToolAppend, args, nil))
				requireUnknownThenRefused(t, again.call(t, mcpfixture.ToolAppend, args2, mode(mcpfixture.ModeIsError)),
					again.call(t, mcpfixture.ToolAppend, args2, nil))
				require.Equal(t, 2, w.effectCount())
				require.Equal(t, 2, w.dispatchCount())
				// A, B, A: another call of the tool came after the host had A's answer, so A
				// again is a new intent, sent.
				third := again.call(t, mcpfixture.ToolAppend, args, nil)
				require.False(t, third.Replayed, third.Raw)
				require.Equal(t, first.Texts, third.Texts)
				require.Equal(t, 3, w.effectCount())
			})
		}
	}
}

// TestHTTPNamespacesAreIsolated: the same call through two tokens of two namespaces runs
// once in each (two effects); each token then gets its own replay.
func TestHTTPNamespacesAreIsolated(t *testing.T) {
	t.Parallel()
	w := setup(t, "gosdk", "")
	url := w.httpProxy(w.store)
	a, b := w.goSDKHTTP(url, tokenA), w.goSDKHTTP(url, tokenB)
	firstA := a.call(t, mcpfixture.ToolAppend, args, nil)
	firstB := b.call(t, mcpfixture.ToolAppend, args, nil)
	require.False(t, firstB.Replayed, "another namespace: not a replay of team-a's call")
	requireReplayOf(t, firstA, a.call(t, mcpfixture.ToolAppend, args, nil))
	requireReplayOf(t, firstB, b.call(t, mcpfixture.ToolAppend, args, nil))
	require.Equal(t, 2, w.effectCount())
}

// TestHTTPHostCancelsAfterTheEffect: a Go SDK host over HTTP (a stateless 2026-07-28 one)
// cancels a call the upstream is acting on (it closes the request): it runs to its answer,
// the retry is refused in_progress meanwhile and then answered from the ledger as a retry;
// one dispatch. The proxy learns of the closed request when its HTTP server does, which
// can come after the answer under load (the answer would then count as the host's, and
// the retry be judged as after a delivered answer), so the fixture is released once the
// proxy has logged that the host stopped waiting: the race itself is not this test's.
func TestHTTPHostCancelsAfterTheEffect(t *testing.T) {
	t.Parallel()
	w := setup(t, "gosdk", "")
	w.fifos()
	w.flags = []string{"--log-level", "info"}
	h := w.goSDKHTTP(w.httpProxy(w.store), tokenA)
	cancelAfterTheEffect(t, w, h, func() { w.awaitStderr("the host stopped waiting for answers") })
}

// TestHTTPUpstreamReplaysAndBlocks: a Go SDK host on stdio, the proxy in front of the
// upstream served over streamable HTTP (--upstream URL), both upstream SDKs: the tool list
// is the upstream's; the same call twice is one effect and a replay; the upstream hanging
// past --timeout is unknown and blocks the retry.
func TestHTTPUpstreamReplaysAndBlocks(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, "")
			w.flags = []string{"--timeout", "1s"}
			url := w.httpFixture()
			direct := w.goSDKHTTP(url, "")
			want := direct.tools(t)
			require.NoError(t, direct.close())

			h := w.goSDK(w.upstreamProxyArgv(w.store, url))
			require.JSONEq(t, string(want), string(h.tools(t)))
			requireReplayOf(t, h.call(t, mcpfixture.ToolAppend, args, nil), h.call(t, mcpfixture.ToolAppend, args, nil))
			o := h.call(t, mcpfixture.ToolAppend, args2, mode(mcpfixture.ModeHang))
			require.Equal(t, kindUnknown, o.Kind, o.Raw)
			o = h.call(t, mcpfixture.ToolAppend, args2, nil)
			require.Equal(t, kindUnknown, o.Kind, o.Raw)
			require.Equal(t, 2, w.effectCount())
			require.Equal(t, 2, w.dispatchCount())
		})
	}
}

// TestHTTPUpstreamProxyKilledAfterTheEffect: the HTTP upstream SIGKILLs the proxy (its pid
// in a file) after its effect; a new proxy refuses the call as unknown once the dead
// proxy's lease is over; effects = 1.
func TestHTTPUpstreamProxyKilledAfterTheEffect(t *testing.T) {
	t.Parallel()
	w := setup(t, "gosdk", "")
	w.flags = []string{"--lease", "1s"}
	w.pidFile = filepath.Join(w.dir, "proxy.pid")
	url := w.httpFixture()
	argv := w.upstreamProxyArgv(w.store, url)
	cmd := exec.Command(argv[0], argv[1:]...)
	h := w.goSDKCmd(cmd)
	require.NoError(t, os.WriteFile(w.pidFile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o600))
	_, err := h.callErr(t.Context(), mcpfixture.ToolAppend, args, mode(mcpfixture.ModeKillParent))
	require.Error(t, err, "the proxy died: the host gets no answer")
	_ = h.close()
	require.Equal(t, 1, w.effectCount())

	h = w.goSDK(w.upstreamProxyArgv(w.store, url))
	untilRefused(t, h, kindUnknown)
	require.NoError(t, h.close())
	require.Equal(t, 1, w.effectCount())
	require.Equal(t, 1, w.dispatchCount())
	requireResidual(t, w, residual.Unknown)
}

// TestTypeScriptHostOverHTTP: a host on the official TypeScript SDK over streamable HTTP to
// `toolfence proxy --http`: its tool list is the one it gets from the upstream over stdio;
// the same call twice is one effect and a replay; an ambiguous answer and its refused retry.
func TestTypeScriptHostOverHTTP(t *testing.T) {
	t.Parallel()
	nodeBin := node(t)
	w := setup(t, "gosdk", "")
	want, _ := w.tsRun(nodeBin, w.directArgv(), nil)
	call := tsCall{Name: mcpfixture.ToolAppend, Arguments: args}
	got, res := w.tsRunHTTP(nodeBin, w.httpProxy(w.store), tokenA, []tsCall{call, call,
		{Name: mcpfixture.ToolAppend, Arguments: args2, Meta: mode(mcpfixture.ModeIsError)},
		{Name: mcpfixture.ToolAppend, Arguments: args2}})
	require.JSONEq(t, string(want), string(got))
	require.Len(t, res, 4)
	requireReplayOf(t, res[0], res[1])
	requireUnknownThenRefused(t, res[2], res[3])
	require.Equal(t, 2, w.effectCount())
	require.Equal(t, 2, w.dispatchCount())
}
