package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// A write that waits for a connection past its write timeout runs nothing once it gets one:
// it fails at once, and it neither closes the connection it was handed nor opens new ones
// (a saturated pool must not turn into a reconnect storm).
func TestWriteTimeoutPassedWhileWaitingForAConnection(t *testing.T) {
	t.Parallel()
	dsn := testkit.PostgresDSN(t)
	schema := testkit.Schema(t, "toolfence_test_retry_")
	ctx := context.Background()
	l, err := Open(ctx, dsn, Options{Schema: schema, MaxConns: 1, WriteTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })

	late := residual.Key("ns", "t", "op", "late")
	held, err := l.pool.Acquire(ctx) // the pool's only connection, busy past the write timeout
	require.NoError(t, err)
	pid := held.Conn().PgConn().PID()
	before := l.pool.Stat().NewConnsCount()
	release := time.AfterFunc(1500*time.Millisecond, held.Release)
	defer release.Stop()

	_, err = l.Reserve(ctx, ledger.ReserveParams{Namespace: "ns", Key: late, Task: "t", Operation: "op",
		Target: "late", Holder: "h", RequestDigest: "d", TTL: time.Minute})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "write timeout passed before a connection was free")
	require.Equal(t, before, l.pool.Stat().NewConnsCount(), "no connection was opened")
	c, err := l.pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	require.Equal(t, pid, c.Conn().PgConn().PID(), "the connection that was handed over is still the pool's")
	var n int
	require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM toolfence_residuals WHERE key = $1`, late).Scan(&n))
	require.Zero(t, n, "nothing was written")
}

// With no CHECK on the state column, the ledger itself refuses to write a state that is
// not one of the five.
func TestWriteArgsRefusesAnInvalidState(t *testing.T) {
	_, err := writeArgs(&residual.Residual{Key: "k", State: "done"}, "")
	require.ErrorIs(t, err, residual.ErrInvalidState)
	_, err = writeArgs(&residual.Residual{Key: "k", State: residual.Succeeded}, "")
	require.NoError(t, err)
}
