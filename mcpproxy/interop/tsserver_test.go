package interop_test

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/residual"
)

// TestTypeScriptOutputValidationMayHaveActed: a tool on the official TypeScript SDK whose
// handler acted and then returned output breaking its own output schema
// (internal/fixture/testdata/tsclient/server.mjs) is answered by the SDK with an isError
// "MCP error -32602: Output validation error: …", after the handler ran. That is not a
// refusal before the tool ran: the call is unknown, the host told so, and the same call is
// refused and not sent again (one effect).
func TestTypeScriptOutputValidationMayHaveActed(t *testing.T) {
	t.Parallel()
	nodeBin := node(t)
	server, err := filepath.Abs(filepath.Join(tsHostDir, "server.mjs"))
	require.NoError(t, err)
	env, err := exec.LookPath("env")
	require.NoError(t, err)
	w := setup(t, "", "")
	effects := filepath.Join(w.dir, "ts-effects")
	h := w.goSDK(w.refArgv("ts", env, "TSSERVER_EFFECTS="+effects, nodeBin, server))
	line := map[string]any{"line": "hello"}
	first := h.call(t, "record", line, nil)
	require.True(t, first.IsError, first.Raw)
	require.Equal(t, kindUnknown, first.Kind, "the tool ran before the SDK refused its output: %s", first.Raw)
	require.Contains(t, first.text(), "the server answered an error; toolfence cannot tell whether it acted")
	require.Contains(t, first.text(), "MCP error -32602: Output validation error: ")
	again := h.call(t, "record", line, nil)
	require.Equal(t, kindUnknown, again.Kind, "refused, not sent: %s", again.Raw)
	require.NoError(t, h.close())
	require.Equal(t, []string{"hello"}, w.lines(effects), "one effect")
	rs := w.residuals()
	require.Len(t, rs, 1)
	require.Equal(t, residual.Unknown, rs[0].State)
	require.Equal(t, 1, rs[0].AttemptCount)
}
