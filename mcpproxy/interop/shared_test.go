package interop_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/fixture/mcpfixture"
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

// TestTwentyConcurrentCallsThroughTwoProxiesOnOneEmbeddedStore: 20 identical calls at once,
// 10 through each of two proxies on one badger store (one the owner, one through its
// socket): one reaches the upstream (held there), the 19 others are in_progress; a call
// through either proxy after it replays.
func TestTwentyConcurrentCallsThroughTwoProxiesOnOneEmbeddedStore(t *testing.T) {
	t.Parallel()
	w := setup(t, "gosdk", "")
	w.fifos()
	w.setMode(mcpfixture.ModeGate)
	hosts := []*goHost{w.goSDK(w.proxyArgv(w.store)), w.goSDK(w.proxyArgv(w.store))}
	results := make(chan outcome, 20)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			o, err := hosts[i%2].callErr(t.Context(), mcpfixture.ToolAppend, args, nil)
			if err != nil {
				o = outcome{Texts: []string{"protocol error: " + err.Error()}, IsError: true}
			}
			results <- o
		})
	}
	w.awaitEntered()
	for range 19 {
		o := <-results
		require.True(t, o.IsError, o.Raw)
		require.Equal(t, kindInProgress, o.Kind, "%s", o.Raw)
	}
	w.release()
	wg.Wait()
	first := <-results
	w.setMode(mcpfixture.ModeOK)
	for _, h := range hosts {
		requireReplayOf(t, first, h.call(t, mcpfixture.ToolAppend, args, nil))
	}
	require.Equal(t, 1, w.effectCount())
	require.Equal(t, 1, w.dispatchCount())
}
