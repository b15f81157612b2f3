package badger

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// waitClosed fails unless ch is closed (after draining) within 10 s.
func waitClosed(t *testing.T, ch <-chan ledger.Change) int {
	t.Helper()
	n := 0
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return n
			}
			n++
		case <-deadline:
			t.Fatal("watch channel not closed")
		}
	}
}

// A reader that does not keep up misses changes but never blocks the writer.
func TestWatchDropsForSlowReader(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{Clock: lease.NewFake(start)})
	ctx := t.Context()
	slow, err := l.Watch(ctx, "ns")
	require.NoError(t, err)

	const n, writers = watchBuffer + 20, 8
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := w; i < n; i += writers {
				_, err := l.Reserve(ctx, reserveParams(fmt.Sprint("w-", i)))
				assert.NoError(t, err, "writer blocked or failed at change %d", i)
			}
		})
	}
	wg.Wait()
	l.hub.mu.Lock()
	dropped := l.hub.dropped
	l.hub.mu.Unlock()
	require.Equal(t, uint64(n-watchBuffer), dropped)

	first := <-slow
	require.Equal(t, residual.Pending, first.State)
	require.Equal(t, "ns", first.Namespace)
	require.NoError(t, l.Close())
	require.Equal(t, watchBuffer-1, waitClosed(t, slow), "buffered changes stay readable after Close")
}

// Close ends every watch channel and stops every goroutine the ledger started, badger's
// included.
func TestCloseStopsGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	l, err := Open(t.TempDir(), Options{})
	require.NoError(t, err)
	chans := make([]<-chan ledger.Change, 0, 3)
	for _, ns := range []string{"", "a", "b"} {
		ch, err := l.Watch(context.Background(), ns)
		require.NoError(t, err)
		chans = append(chans, ch)
	}
	_, err = l.Reserve(t.Context(), reserveParams("x"))
	require.NoError(t, err)
	require.NoError(t, l.Close())
	for _, ch := range chans {
		waitClosed(t, ch)
	}
	require.ErrorIs(t, l.Close(), lease.ErrClosed)
	_, err = l.Watch(t.Context(), "")
	require.ErrorIs(t, err, lease.ErrClosed)
}

// Ending a watch's context closes its channel and ends its goroutine, while the ledger
// stays open.
func TestWatchEndsWithContext(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{Clock: lease.NewFake(start)})
	before := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := l.Watch(ctx, "ns")
	require.NoError(t, err)
	cancel()
	waitClosed(t, ch)
	require.NoError(t, goleak.Find(before))
	l.hub.mu.Lock()
	defer l.hub.mu.Unlock()
	require.Empty(t, l.hub.subs)
}
