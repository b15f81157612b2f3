package interop_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/mcpfixture"
	"github.com/toolfence/toolfence/residual"
)

// TestTwoProxiesOnOneEmbeddedStore: two hosts each start a proxy on one badger --store (the
// first owns it, the second goes through it): both serve; while the call through the first
// is held upstream the same call through the second is in_progress, then a replay. One
// dispatch.
func TestTwoProxiesOnOneEmbeddedStore(t *testing.T) {
	t.Parallel()
	w := setup(t, "gosdk", "")
	w.fifos()
	a := w.goSDK(w.proxyArgv(w.store))
	b := w.goSDK(w.proxyArgv(w.store))
	first := make(chan outcome, 1)
	go func() {
		o, err := a.callErr(t.Context(), mcpfixture.ToolAppend, args, mode(mcpfixture.ModeGate))
		if err != nil {
			o = outcome{IsError: true, Texts: []string{err.Error()}}
		}
		first <- o
	}()
	w.awaitEntered()
	o := b.call(t, mcpfixture.ToolAppend, args, nil)
	require.Equal(t, kindInProgress, o.Kind, o.Raw)
	w.release()
	requireReplayOf(t, <-first, b.call(t, mcpfixture.ToolAppend, args, nil))
	require.NoError(t, a.close())
	require.NoError(t, b.close())
	require.Equal(t, 1, w.effectCount())
	require.Equal(t, 1, w.dispatchCount())
	requireResidual(t, w, residual.Succeeded)
}

// TestOwnerProxyKilledAfterTheEffect: of two proxies on one badger store, the owner is
// SIGKILLed (by its upstream) after the effect; the other takes the store over and, once the
// dead proxy's lease is over, refuses the call as unknown. Effects = 1.
func TestOwnerProxyKilledAfterTheEffect(t *testing.T) {
	t.Parallel()
	w := setup(t, "gosdk", "")
	w.flags = []string{"--lease", "1s"}
	owner := w.goSDK(w.proxyArgv(w.store))
	other := w.goSDK(w.proxyArgv(w.store))
	_, err := owner.callErr(t.Context(), mcpfixture.ToolAppend, args, mode(mcpfixture.ModeKillParent))
	require.Error(t, err, "the owner died: its host gets no answer")
	_ = owner.close()
	untilRefused(t, other, kindUnknown)
	require.NoError(t, other.close())
	require.Equal(t, 1, w.effectCount())
	require.Equal(t, 1, w.dispatchCount())
	requireResidual(t, w, residual.Unknown)
}
