package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// waitQueued waits until l's groups hold reserves and commits queued calls.
func waitQueued(t *testing.T, l *postgres.Ledger, reserves, commits int) {
	t.Helper()
	require.Eventually(t, func() bool {
		r, c := postgres.Queued(l)
		return r == reserves && c == commits
	}, 20*time.Second, time.Millisecond, "the calls never queued")
}

// reserveAll runs Reserve for every p at once and returns the results in order.
func reserveAll(ctx context.Context, l *postgres.Ledger, ps []ledger.ReserveParams) ([]*ledger.ReserveResult, []error) {
	out, errs := make([]*ledger.ReserveResult, len(ps)), make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { out[i], errs[i] = l.Reserve(ctx, p) })
	}
	wg.Wait()
	return out, errs
}

// Concurrent Reserves and Commits that queue behind a running one share one statement:
// every row of a shared statement carries that statement's clock. What a shared statement
// cannot settle (a second call for a key in it, a key already taken, a fence that does not
// hold) is decided on the call's own path, as without sharing.
func TestConcurrentCallsShareOneStatement(t *testing.T) {
	t.Parallel()
	l := setup(t)
	ctx := context.Background()
	done := params("shared:done", "earlier")
	res, err := l.Reserve(ctx, done)
	require.NoError(t, err)
	_, err = l.Commit(ctx, commitOf(done, res, residual.Succeeded))
	require.NoError(t, err)

	var ps []ledger.ReserveParams
	for i := range 6 {
		ps = append(ps, params(fmt.Sprintf("shared:%d", i), fmt.Sprintf("worker-%d", i)))
	}
	twice := params("shared:0", "rival") // the same key as ps[0]
	ps = append(ps, twice, done)
	release := postgres.HoldGroups(l)
	var results []*ledger.ReserveResult
	var errs []error
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		results, errs = reserveAll(ctx, l, ps)
	}()
	waitQueued(t, l, len(ps), 0)
	release()
	<-finished
	for _, err := range errs {
		require.NoError(t, err)
	}
	first := results[1].Residual.CreatedAt
	for i := range 6 {
		if i == 0 && results[i].Decision != ledger.Acquired {
			continue // the rival took the key first
		}
		require.Equal(t, ledger.Acquired, results[i].Decision, "call %d", i)
		require.Equal(t, uint64(1), results[i].Lease.Token)
		if i > 0 {
			require.Equal(t, first, results[i].Residual.CreatedAt, "call %d ran in the shared insert", i)
		}
	}
	require.ElementsMatch(t, []ledger.Decision{ledger.Acquired, ledger.InProgress},
		[]ledger.Decision{results[0].Decision, results[6].Decision}, "one of two calls for one key acquires it")
	require.Equal(t, ledger.Replay, results[7].Decision, "a settled key answers from the ledger")

	var cs []ledger.CommitParams
	for i := range 6 {
		p, r := ps[i], results[i]
		if r.Decision != ledger.Acquired {
			p, r = twice, results[6]
		}
		cs = append(cs, commitOf(p, r, residual.Succeeded))
	}
	stale := cs[1]
	stale.Token++ // no such attempt: the fence does not hold
	cs = append(cs, stale)
	cs[2].Outcome, cs[2].Result, cs[2].Error = residual.Failed, nil, "upstream said no"
	release = postgres.HoldGroups(l)
	committed, cerrs := make([]*residual.Residual, len(cs)), make([]error, len(cs))
	var wg sync.WaitGroup
	for i, cp := range cs {
		wg.Go(func() { committed[i], cerrs[i] = l.Commit(ctx, cp) })
	}
	waitQueued(t, l, 0, len(cs))
	release()
	wg.Wait()
	// The stale commit and the good one of its key never share a statement: whichever
	// ran first, the good one commits and the stale one is refused.
	require.ErrorIs(t, cerrs[6], residual.ErrLeaseLost)
	for i := range 6 {
		require.NoError(t, cerrs[i], "commit %d", i)
		want := residual.Succeeded
		if i == 2 {
			want = residual.Failed
		}
		require.Equal(t, want, committed[i].State)
		got, err := l.Get(ctx, ledger.GetParams{Namespace: ns, Key: cs[i].Key})
		require.NoError(t, err)
		require.Equal(t, want, got.State)
		if i != 1 { // the stale commit of its key may have added evidence since
			require.Equal(t, committed[i].UpdatedAt, got.UpdatedAt, "commit %d returned what it stored", i)
		}
		if i == 2 {
			require.Equal(t, "upstream said no", got.Current().Error)
		} else {
			require.Equal(t, `{"ok":true}`, string(got.Result))
		}
	}
	require.Equal(t, committed[0].UpdatedAt, committed[3].UpdatedAt, "the commits ran in one statement")
}

// While few calls are in flight, a call that finds its step busy runs beside it instead of
// queueing: with the slots held, 8 Reserves and their Commits finish without waiting. Past
// 8 calls in flight (the ledger's load, simulated here), a call queues behind the busy step
// and runs when it frees.
func TestFewCallsRunBesideABusyStep(t *testing.T) {
	t.Parallel()
	l := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // queued calls give up
	defer cancel()
	release := postgres.HoldSlots(l)
	var ps []ledger.ReserveParams
	for i := range 8 {
		ps = append(ps, params(fmt.Sprintf("beside:%d", i), fmt.Sprintf("worker-%d", i)))
	}
	results, errs := reserveAll(ctx, l, ps)
	var wg sync.WaitGroup
	for i, p := range ps {
		require.NoError(t, errs[i])
		require.Equal(t, ledger.Acquired, results[i].Decision)
		wg.Go(func() {
			_, err := l.Commit(ctx, commitOf(p, results[i], residual.Succeeded))
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	r, c := postgres.Queued(l)
	require.Equal(t, [2]int{0, 0}, [2]int{r, c}, "nothing queued")

	postgres.AddLoad(l, 8) // 8 calls in flight elsewhere: the next one is the 9th
	busy := params("beside:busy", "worker")
	done := make(chan error, 1)
	go func() {
		_, err := l.Reserve(ctx, busy)
		done <- err
	}()
	waitQueued(t, l, 1, 0)
	postgres.AddLoad(l, -8)
	release()
	require.NoError(t, <-done)
	got, err := l.Get(ctx, ledger.GetParams{Namespace: ns, Key: busy.Key})
	require.NoError(t, err)
	require.Equal(t, residual.Pending, got.State)
}

// A Reserve that waits in the queue when its caller gives up leaves without writing.
func TestQueuedReserveLeavesOnCancel(t *testing.T) {
	t.Parallel()
	l := setup(t)
	release := postgres.HoldGroups(l)
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	p := params("queued:cancel", "worker")
	errc := make(chan error, 1)
	go func() {
		_, err := l.Reserve(ctx, p)
		errc <- err
	}()
	waitQueued(t, l, 1, 0)
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	waitQueued(t, l, 0, 0)
	_, err := l.Get(context.Background(), ledger.GetParams{Namespace: ns, Key: p.Key})
	require.ErrorIs(t, err, residual.ErrNotFound, "nothing was written")
}

// The connection of a shared insert breaks after the statement was sent: each call finds
// its own reservation and acquires, once.
func TestFaultSharedReserveReplyLost(t *testing.T) {
	t.Parallel()
	proxy := newFaultProxy(t)
	f := newFaultEnv(t, func(v url.Values) string { return proxy.dsn(v) })
	ctx := context.Background()
	ps := []ledger.ReserveParams{params("shared-lost:a", "a"), params("shared-lost:b", "b"), params("shared-lost:c", "c")}
	release := postgres.HoldGroups(f.l)
	proxy.loseReplyTo("unnest(")
	var results []*ledger.ReserveResult
	var errs []error
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		results, errs = reserveAll(ctx, f.l, ps)
	}()
	waitQueued(t, f.l, len(ps), 0)
	release()
	<-finished
	require.Equal(t, int32(1), proxy.cuts.Load())
	for i, p := range ps {
		require.NoError(t, errs[i])
		require.Equal(t, ledger.Acquired, results[i].Decision)
		require.Equal(t, uint64(1), results[i].Lease.Token)
		require.Len(t, results[i].Residual.Attempts, 1)
		other, err := f.l.Reserve(ctx, params(p.Target, "other"))
		require.NoError(t, err)
		require.Equal(t, ledger.InProgress, other.Decision)
	}
}

// The connection of a shared commit breaks after the statement was sent: each call re-reads
// its residual, finds its commit and reports it.
func TestFaultSharedCommitReplyLost(t *testing.T) {
	t.Parallel()
	proxy := newFaultProxy(t)
	f := newFaultEnv(t, func(v url.Values) string { return proxy.dsn(v) })
	ctx := context.Background()
	var cs []ledger.CommitParams
	for _, target := range []string{"a", "b", "c"} {
		p := params("shared-commit-lost:"+target, target)
		cs = append(cs, commitOf(p, f.acquireAndExecute(p), residual.Succeeded))
	}
	release := postgres.HoldGroups(f.l)
	proxy.loseReplyTo("b.bout")
	var wg sync.WaitGroup
	errs := make([]error, len(cs))
	got := make([]*residual.Residual, len(cs))
	for i, cp := range cs {
		wg.Go(func() { got[i], errs[i] = f.l.Commit(ctx, cp) })
	}
	waitQueued(t, f.l, 0, len(cs))
	release()
	wg.Wait()
	require.Equal(t, int32(1), proxy.cuts.Load())
	for i, cp := range cs {
		require.NoError(t, errs[i])
		require.Equal(t, residual.Succeeded, got[i].State)
		require.Empty(t, got[i].Evidence, "a commit that landed leaves no evidence")
		r, err := f.l.Get(ctx, ledger.GetParams{Namespace: ns, Key: cp.Key})
		require.NoError(t, err)
		require.Equal(t, residual.Succeeded, r.State)
	}
}

// reserveN reserves a key for each target and returns the commits of their leases.
func reserveN(t *testing.T, l *postgres.Ledger, targets ...string) []ledger.CommitParams {
	t.Helper()
	var cs []ledger.CommitParams
	for _, target := range targets {
		p := params(target, "worker")
		res, err := l.Reserve(context.Background(), p)
		require.NoError(t, err)
		require.Equal(t, ledger.Acquired, res.Decision)
		cs = append(cs, commitOf(p, res, residual.Succeeded))
	}
	return cs
}

// commitAsync starts a Commit of cp and returns the channel its error arrives on.
func commitAsync(l *postgres.Ledger, cp ledger.CommitParams) <-chan error {
	errc := make(chan error, 1)
	go func() {
		_, err := l.Commit(context.Background(), cp)
		errc <- err
	}()
	return errc
}

// requireDone waits for the errors of calls, all nil, well before the write timeout.
func requireDone(t *testing.T, calls ...<-chan error) {
	t.Helper()
	for _, c := range calls {
		select {
		case err := <-c:
			require.NoError(t, err)
		case <-time.After(15 * time.Second):
			t.Fatal("a call waited behind a row it does not write")
		}
	}
}

// A row lock held elsewhere holds up only the call of that row: a shared commit that would
// wait on it gives up within its lock timeout, and the other calls commit alone.
func TestSharedCommitDoesNotWaitOnALockedRow(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	l := open(t, schema, postgres.Options{WriteTimeout: time.Minute})
	cs := reserveN(t, l, "locked:x", "locked:a", "locked:b")
	lock := lockRow(t, schema, cs[0].Key)
	release := postgres.HoldGroups(l)
	calls := []<-chan error{commitAsync(l, cs[0]), commitAsync(l, cs[1]), commitAsync(l, cs[2])}
	waitQueued(t, l, 0, 3)
	release()
	requireDone(t, calls[1], calls[2])
	select {
	case err := <-calls[0]:
		t.Fatalf("the commit of the locked row returned while the lock was held: %v", err)
	default:
	}
	require.NoError(t, lock.Rollback(context.Background()))
	requireDone(t, calls[0])
}

// A call running alone whose statement waits on a lock frees its slot: the calls after it
// do not queue behind it.
func TestLoneCallWaitingOnALockFreesTheSlot(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	app := "tf-lone-" + strings.ToLower(rand.Text()[:10])
	l, err := postgres.Open(context.Background(), withParams(url.Values{"application_name": {app}}),
		postgres.Options{Schema: schema, WriteTimeout: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	cs := reserveN(t, l, "lone:x", "lone:a")
	lock := lockRow(t, schema, cs[0].Key)
	blocked := commitAsync(l, cs[0])
	admin := adminConn(t, schema)
	require.Eventually(t, func() bool {
		var n int
		return admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n) == nil && n > 0
	}, 20*time.Second, 5*time.Millisecond, "the commit never waited on the lock")
	requireDone(t, commitAsync(l, cs[1]))
	require.NoError(t, lock.Rollback(context.Background()))
	requireDone(t, blocked)
}
