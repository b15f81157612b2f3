package interop_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/fixture/mcpfixture"
	"github.com/toolfence/toolfence/residual"
)

// probePolicy protects append by its target and names find as its probe.
const probePolicy = `{"tools": {"append": {"target": ["/target"],
	"probe": {"tool": "find", "arguments": {"target": "/target", "text": "/text"}, "found": "/found"}}}}`

// untilAnswered calls append with args until the answer is not an in_progress refusal (the
// dead proxy's lease has to run out first) and returns it; it fails after 20 s.
func untilAnswered(t *testing.T, h *goHost) outcome {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		o := h.call(t, mcpfixture.ToolAppend, args, nil)
		if o.Kind != kindInProgress {
			return o
		}
		require.True(t, time.Now().Before(deadline), "still in_progress after 20 s: %s", o.Raw)
		time.Sleep(50 * time.Millisecond) // a lease expiry is a matter of time: poll the refusal
	}
}

// TestProbeSettlesAKilledProxysCall: the upstream SIGKILLs the proxy after its effect; with
// a probe in the policy, the call through a new proxy (once the lease is over) asks the
// probe, which finds the effect: the call is recorded succeeded and replayed. Effects = 1.
func TestProbeSettlesAKilledProxysCall(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, probePolicy)
			w.flags = []string{"--lease", "1s"}
			h := w.goSDK(w.proxyArgv(w.store))
			_, err := h.callErr(t.Context(), mcpfixture.ToolAppend, args, mode(mcpfixture.ModeKillParent))
			require.Error(t, err, "the proxy died: the host gets no answer")
			_ = h.close()

			h = w.goSDK(w.proxyArgv(w.store))
			o := untilAnswered(t, h)
			require.False(t, o.IsError, o.Raw)
			require.True(t, o.Replayed, "the probe found the effect: a replay, %s", o.Raw)
			again := h.call(t, mcpfixture.ToolAppend, args, nil)
			require.True(t, again.Replayed, again.Raw)
			require.NoError(t, h.close())
			require.Equal(t, 1, w.effectCount())
			require.Equal(t, 1, w.dispatchCount())
			requireResidual(t, w, residual.Succeeded)
		})
	}
}

// probeTrustingNotFound is probePolicy whose probe's "not found" is trusted 1ms after the
// attempt began (the upstream that ran it is dead: nothing still runs it).
const probeTrustingNotFound = `{"tools": {"append": {"target": ["/target"],
	"probe": {"tool": "find", "arguments": {"target": "/target", "text": "/text"}, "found": "/found", "not_found_after": "1ms"}}}}`

// TestProbeNotFoundDispatchesAgain: the upstream dies before any effect; with a probe, the
// call through a new proxy asks it, it finds nothing, the attempt is recorded failed and
// the call is sent again and acts. Effects = 1, dispatches = 2. With the default
// not_found_after (the timeout) the same call is refused instead: the attempt may still run.
func TestProbeNotFoundDispatchesAgain(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, probePolicy)
			h := w.goSDK(w.proxyArgv(w.store))
			o := h.call(t, mcpfixture.ToolAppend, args, mode(mcpfixture.ModeCrashBefore))
			require.Equal(t, kindUnknown, o.Kind, o.Raw)
			_ = h.close()
			require.Zero(t, w.effectCount())

			h = w.goSDK(w.proxyArgv(w.store))
			o = h.call(t, mcpfixture.ToolAppend, args, nil)
			require.Equal(t, kindUnknown, o.Kind, "not found, but the attempt began less than not_found_after ago: %s", o.Raw)
			require.Contains(t, string(o.Raw), "may still be running upstream")
			require.NoError(t, h.close())
			require.Equal(t, 1, w.dispatchCount())

			require.NoError(t, os.WriteFile(w.policy, []byte(probeTrustingNotFound), 0o600))
			h = w.goSDK(w.proxyArgv(w.store))
			o = h.call(t, mcpfixture.ToolAppend, args, nil)
			require.False(t, o.IsError, o.Raw)
			require.False(t, o.Replayed)
			require.Equal(t, []string{"appended hello to inbox:bob"}, o.Texts)
			require.NoError(t, h.close())
			require.Equal(t, 1, w.effectCount())
			require.Equal(t, 2, w.dispatchCount())
			requireResidual(t, w, residual.Succeeded)
		})
	}
}

// TestTaskSettledByTasksGet: after the task of TestTaskResultIsAwaitingUpstream completes
// upstream, the next call asks tasks/get (and tasks/result), records the call succeeded and
// replays the task's result. Effects = 1.
func TestTaskSettledByTasksGet(t *testing.T) {
	t.Parallel()
	w := setup(t, "mcpgo", "")
	w.fifos()
	h := w.mcpGo(w.proxyArgv(w.store))
	o := h.callTask(t, mcpfixture.ToolAppend, args, mode(mcpfixture.ModeGate))
	require.Equal(t, kindAwaiting, o.Kind, o.Raw)
	w.awaitEntered()
	o = h.call(t, mcpfixture.ToolAppend, args, nil)
	require.Equal(t, kindAwaiting, o.Kind, "the task is still working: %s", o.Raw)
	w.release()
	deadline := time.Now().Add(20 * time.Second)
	for {
		o = h.call(t, mcpfixture.ToolAppend, args, nil)
		if o.Kind != kindAwaiting {
			break
		}
		require.True(t, time.Now().Before(deadline), "still awaiting upstream after 20 s: %s", o.Raw)
		time.Sleep(50 * time.Millisecond) // the task completes in the upstream's own time
	}
	require.True(t, o.Replayed, o.Raw)
	require.Contains(t, o.Texts, "appended hello to inbox:bob", "the task's result is replayed")
	require.NoError(t, h.close())
	require.Equal(t, 1, w.effectCount())
	require.Equal(t, 1, w.dispatchCount())
	requireResidual(t, w, residual.Succeeded)
}

// TestChangedCatalogRefusedUntilLocked: with pins written by `toolfence proxy lock`, a
// protected tool whose definition changes upstream is refused (kind pin, nothing sent)
// until `proxy lock` runs again; both upstream SDKs.
func TestChangedCatalogRefusedUntilLocked(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, `{"tools": {"append": {"target": ["/target"]}}}`)
			lock := func() {
				t.Helper()
				r := w.run(bin, "proxy", "lock", "--config", w.policy, "--server-id", "fx", "--", fxBin, fx)
				require.Zero(t, r.code, r.stderr)
			}
			lock()
			require.FileExists(t, strings.TrimSuffix(w.policy, ".json")+".pins.json")
			h := w.goSDK(w.proxyArgv(w.store))
			require.False(t, h.call(t, mcpfixture.ToolAppend, args, nil).IsError)
			require.NoError(t, h.close())

			require.NoError(t, os.WriteFile(w.catalog, []byte("v2"), 0o600))
			h = w.goSDK(w.proxyArgv(w.store))
			o := h.call(t, mcpfixture.ToolAppend, args2, nil)
			require.True(t, o.IsError)
			require.Equal(t, "pin", o.Kind, o.Raw)
			require.Contains(t, o.text(), "proxy lock")
			require.Equal(t, []string{"1 lines"}, h.call(t, mcpfixture.ToolRead, map[string]any{}, nil).Texts, "read-only tools are not pinned")
			require.NoError(t, h.close())
			require.Equal(t, 1, w.dispatchCount(), "nothing sent for the refused call")

			lock()
			h = w.goSDK(w.proxyArgv(w.store))
			o = h.call(t, mcpfixture.ToolAppend, args2, nil)
			require.False(t, o.IsError, o.Raw)
			require.NoError(t, h.close())
			require.Equal(t, 2, w.effectCount())
		})
	}
}
