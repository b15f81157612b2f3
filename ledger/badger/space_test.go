package badger

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// TestGuardSpace: below the reserve new reservations are refused with ErrLowSpace and
// nothing is written, while a call reserved before can still commit; with space back,
// reservations work again. The filesystem is simulated by the injected free-space reader.
func TestGuardSpace(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := Open(dir, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	var free atomic.Uint64
	free.Store(1 << 30)
	g := GuardSpace(l, dir, 64<<20, func(got string) (uint64, error) {
		require.Equal(t, dir, got)
		return free.Load(), nil
	})

	inFlight := reserveParams("inflight")
	res, err := g.Reserve(t.Context(), inFlight)
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, res.Decision)

	free.Store(10 << 20) // the disk fills up
	refused := reserveParams("new")
	_, err = g.Reserve(t.Context(), refused)
	require.ErrorIs(t, err, ErrLowSpace)
	require.Contains(t, err.Error(), "10 MiB free")
	_, err = g.Get(t.Context(), ledger.GetParams{Namespace: refused.Namespace, Key: refused.Key})
	require.ErrorIs(t, err, residual.ErrNotFound, "nothing was written")

	r, err := g.Commit(t.Context(), ledger.CommitParams{
		Namespace: inFlight.Namespace, Key: inFlight.Key, Holder: inFlight.Holder, Token: res.Lease.Token,
		Outcome: residual.Succeeded, Result: []byte(`{"ok":true}`),
	})
	require.NoError(t, err, "a call in flight still commits")
	require.Equal(t, residual.Succeeded, r.State)

	free.Store(1 << 30)
	_, err = g.Reserve(t.Context(), refused)
	require.NoError(t, err, "reservations resume once space is back")
}

func TestDiskFree(t *testing.T) {
	t.Parallel()
	n, err := DiskFree(t.TempDir())
	require.NoError(t, err)
	require.Positive(t, n)
	_, err = DiskFree("/no/such/dir")
	require.Error(t, err)
}
