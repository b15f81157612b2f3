package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// receiveChange waits for one change, failing after 10 s.
func receiveChange(t *testing.T, ch <-chan ledger.Change) ledger.Change {
	t.Helper()
	select {
	case c, ok := <-ch:
		require.True(t, ok, "watch channel closed early")
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no change delivered within 10s")
		return ledger.Change{}
	}
}

// requireChannelClosed drains ch until it closes, failing after 10 s.
func requireChannelClosed(t *testing.T, ch <-chan ledger.Change) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("watch channel not closed within 10s")
		}
	}
}

// watcherPIDs returns the registered LISTEN backends of the ledger's schema.
func watcherPIDs(t *testing.T, schema string) []int32 {
	t.Helper()
	rows, err := adminConn(t, schema).Query(context.Background(), `SELECT pid FROM toolfence_watchers ORDER BY pid`)
	require.NoError(t, err)
	var pids []int32
	for rows.Next() {
		var pid int32
		require.NoError(t, rows.Scan(&pid))
		pids = append(pids, pid)
	}
	require.NoError(t, rows.Err())
	return pids
}

// Watch survives the loss of its LISTEN connection, stops on ctx end and on Close, and
// leaves no goroutine behind. Not parallel, so that goleak sees only this test.
func TestWatchReconnectsAndStops(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	schema := newSchema(t)
	l := open(t, schema, postgres.Options{})
	ctx := context.Background()
	admin := adminConn(t, schema)

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := l.Watch(wctx, ns)
	require.NoError(t, err)
	onClose, err := l.Watch(ctx, "")
	require.NoError(t, err)
	pids := watcherPIDs(t, schema)
	require.Len(t, pids, 2, "each watch registers its LISTEN backend")

	p := params("watch:1", "agent-a")
	res, err := l.Reserve(ctx, p)
	require.NoError(t, err)
	require.Equal(t, ledger.Change{Namespace: ns, Key: p.Key, State: residual.Pending}, receiveChange(t, ch))
	require.Equal(t, residual.Pending, receiveChange(t, onClose).State)

	// Kill the first watch's connection: it reconnects and keeps delivering.
	var ok bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pids[0]).Scan(&ok))
	require.NoError(t, admin.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pids[1]).Scan(&ok))
	require.Eventually(t, func() bool {
		now := watcherPIDs(t, schema)
		return len(now) == 2 && now[0] != pids[0] && now[0] != pids[1] && now[1] != pids[0] && now[1] != pids[1]
	}, 20*time.Second, 10*time.Millisecond, "watches re-registered on new connections")
	_, err = l.Commit(ctx, commitOf(p, res, residual.Succeeded))
	require.NoError(t, err)
	require.Equal(t, ledger.Change{Namespace: ns, Key: p.Key, State: residual.Succeeded}, receiveChange(t, ch))
	require.Equal(t, residual.Succeeded, receiveChange(t, onClose).State)

	// Ending the context closes one watch; closing the ledger closes the other.
	cancel()
	requireChannelClosed(t, ch)
	require.Eventually(t, func() bool { return len(watcherPIDs(t, schema)) == 1 }, 10*time.Second, 10*time.Millisecond,
		"an ended watch unregisters, so writers stop notifying")
	require.NoError(t, l.Close())
	requireChannelClosed(t, onClose)
	require.Empty(t, watcherPIDs(t, schema))
	_, err = l.Watch(ctx, ns)
	require.ErrorIs(t, err, lease.ErrClosed)
}

// Writers notify only while a watch is registered: a listener that has not registered
// receives nothing for earlier writes, and the first notification after it registers is
// the next write (notifications arrive in commit order, so no sleeping is needed).
func TestNotifyOnlyWhileWatched(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	l := open(t, schema, postgres.Options{})
	ctx := context.Background()
	listener := adminConn(t, schema)
	_, err := listener.Exec(ctx, `LISTEN `+pgx.Identifier{"toolfence:" + l.Schema()}.Sanitize())
	require.NoError(t, err)

	unwatched := params("notify:unwatched", "agent-a")
	_, err = l.Reserve(ctx, unwatched)
	require.NoError(t, err)

	_, err = listener.Exec(ctx, `INSERT INTO toolfence_watchers (pid) VALUES (pg_backend_pid())`)
	require.NoError(t, err)
	watched := params("notify:watched", "agent-a")
	_, err = l.Reserve(ctx, watched)
	require.NoError(t, err)

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(wctx)
	require.NoError(t, err)
	require.Contains(t, n.Payload, watched.Key, "the unwatched write sent nothing")
	require.NotContains(t, n.Payload, unwatched.Key)
}

// A watch asked for under a context that has ended fails with the context's error, not as
// an unavailable server: callers shutting down must not log it as a failure.
func TestWatchOfAnEndedContext(t *testing.T) {
	t.Parallel()
	l := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := l.Watch(ctx, "")
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ledger.ErrUnavailable)
}
