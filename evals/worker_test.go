package evals

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGateLetsStartedAgentsFirst: with the gate full, an agent that already holds a
// reservation (urgent) gets the next place before agents that have not started, and the
// gate never admits more than its limit.
func TestGateLetsStartedAgentsFirst(t *testing.T) {
	t.Parallel()
	g := newGate(2)
	g.enter(false)
	g.enter(false) // full
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	waiting := func(name string, urgent bool) {
		wg.Go(func() {
			g.enter(urgent)
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
		})
	}
	queued := func(n int) func() bool {
		return func() bool {
			g.mu.Lock()
			defer g.mu.Unlock()
			return len(g.urgent)+len(g.normal) == n
		}
	}
	waiting("new-1", false)
	require.Eventually(t, queued(1), 5*time.Second, time.Millisecond)
	waiting("new-2", false)
	require.Eventually(t, queued(2), 5*time.Second, time.Millisecond)
	waiting("started", true)
	require.Eventually(t, queued(3), 5*time.Second, time.Millisecond)

	admitted := func(n int) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == n }
	}
	for n := 1; n <= 3; n++ {
		g.leave() // one place at a time
		require.Eventually(t, admitted(n), 5*time.Second, time.Millisecond)
	}
	wg.Wait()
	require.Equal(t, []string{"started", "new-1", "new-2"}, order, "urgent first, then first come first served")
	g.mu.Lock()
	require.Equal(t, 2, g.active, "the places were handed over, never more than the limit")
	g.mu.Unlock()
}
