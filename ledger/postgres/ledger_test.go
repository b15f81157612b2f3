package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

func TestReserveCommitReplay(t *testing.T) {
	t.Parallel()
	l := setup(t)
	ctx := context.Background()
	p := params("invoice:1", "agent-a")

	res, err := l.Reserve(ctx, p)
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, res.Decision)
	require.Equal(t, uint64(1), res.Lease.Token)
	require.Equal(t, residual.Pending, res.Residual.State)
	require.Len(t, res.Residual.Attempts, 1)
	require.WithinDuration(t, res.Residual.CreatedAt.Add(p.TTL), res.Lease.Expires, time.Millisecond)

	again, err := l.Reserve(ctx, params("invoice:1", "agent-b"))
	require.NoError(t, err)
	require.Equal(t, ledger.InProgress, again.Decision)
	require.Equal(t, res.Residual, again.Residual, "the losing reserve returns the stored row")

	done, err := l.Commit(ctx, commitOf(p, res, residual.Succeeded))
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, done.State)
	require.True(t, done.Current().Released)
	require.Equal(t, []byte(`{"ok":true}`), done.Result)

	replay, err := l.Reserve(ctx, p)
	require.NoError(t, err)
	require.Equal(t, ledger.Replay, replay.Decision)
	require.Equal(t, done, replay.Residual)

	got, err := l.Get(ctx, ledger.GetParams{Namespace: ns, Key: p.Key})
	require.NoError(t, err)
	require.Equal(t, done, got)

	other := p
	other.RequestDigest = "other"
	mm, err := l.Reserve(ctx, other)
	require.NoError(t, err)
	require.Equal(t, ledger.PayloadMismatch, mm.Decision)
}

func TestFailedRetryTakesNextToken(t *testing.T) {
	t.Parallel()
	l := setup(t)
	ctx := context.Background()
	p := params("ticket:7", "agent-a")
	res, err := l.Reserve(ctx, p)
	require.NoError(t, err)
	_, err = l.Commit(ctx, commitOf(p, res, residual.Failed))
	require.NoError(t, err)

	res2, err := l.Reserve(ctx, p)
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, res2.Decision)
	require.Equal(t, uint64(2), res2.Lease.Token)
	require.Len(t, res2.Residual.Attempts, 2)
	require.Equal(t, residual.Failed, res2.Residual.Attempts[0].Outcome)

	// The first holder's token is stale now: its late commit is refused and kept as evidence.
	_, err = l.Commit(ctx, commitOf(p, res, residual.Succeeded))
	require.ErrorIs(t, err, residual.ErrLeaseLost)
	got, err := l.Get(ctx, ledger.GetParams{Namespace: ns, Key: p.Key})
	require.NoError(t, err)
	require.Equal(t, residual.Pending, got.State)
	require.Len(t, got.Evidence, 1)
	require.Equal(t, uint64(1), got.Evidence[0].Token)
}

func TestExpiryFollowsServerClock(t *testing.T) {
	t.Parallel()
	l := setup(t)
	ctx := context.Background()
	p := params("email:bob", "agent-a")
	p.TTL = 10 * time.Second
	res, err := l.Reserve(ctx, p)
	require.NoError(t, err)

	renewed, err := l.Renew(ctx, ledger.RenewParams{Namespace: ns, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token, TTL: 20 * time.Second})
	require.NoError(t, err)
	require.True(t, renewed.Expires.After(res.Lease.Expires))

	l.SetTimeOffset(21 * time.Second)
	got, err := l.Get(ctx, ledger.GetParams{Namespace: ns, Key: p.Key})
	require.NoError(t, err)
	require.Equal(t, residual.Unknown, got.State)

	_, err = l.Renew(ctx, ledger.RenewParams{Namespace: ns, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token, TTL: time.Second})
	require.ErrorIs(t, err, residual.ErrLeaseLost)

	_, err = l.Commit(ctx, commitOf(p, res, residual.Succeeded))
	require.ErrorIs(t, err, residual.ErrLeaseLost)

	blocked, err := l.Reserve(ctx, p)
	require.NoError(t, err)
	require.Equal(t, ledger.UnknownOutcome, blocked.Decision)

	resolved, err := l.Resolve(ctx, ledger.ResolveParams{Namespace: ns, Key: p.Key, As: residual.Succeeded, By: "op", Note: "checked upstream"})
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, resolved.State)
	require.Equal(t, uint64(2), resolved.Token)

	page, err := l.List(ctx, ledger.ListParams{Namespace: ns, States: []residual.State{residual.Succeeded}})
	require.NoError(t, err)
	require.Len(t, page.Residuals, 1)
	require.Equal(t, resolved, page.Residuals[0])
}

func TestConcurrentReserveOneWinner(t *testing.T) {
	t.Parallel()
	l := setup(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for i := range 16 {
		wg.Go(func() {
			res, err := l.Reserve(ctx, params("deploy:prod", "agent-"+string(rune('a'+i))))
			if err != nil {
				t.Error(err)
				return
			}
			if res.Decision == ledger.Acquired {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Equal(t, 1, wins)
}

func TestGCKeepsTokensAndOpenResiduals(t *testing.T) {
	t.Parallel()
	l := setup(t)
	ctx := context.Background()
	done := params("a", "h")
	res, err := l.Reserve(ctx, done)
	require.NoError(t, err)
	_, err = l.Commit(ctx, commitOf(done, res, residual.Succeeded))
	require.NoError(t, err)
	open := params("b", "h")
	_, err = l.Reserve(ctx, open)
	require.NoError(t, err)

	l.SetTimeOffset(time.Hour) // the open one is unknown now, and must survive GC
	gc, err := l.GC(ctx, ledger.GCParams{Before: time.Now().Add(2 * time.Hour)})
	require.NoError(t, err)
	require.Equal(t, 1, gc.Deleted)
	_, err = l.Get(ctx, ledger.GetParams{Namespace: ns, Key: done.Key})
	require.ErrorIs(t, err, residual.ErrNotFound)
	kept, err := l.Get(ctx, ledger.GetParams{Namespace: ns, Key: open.Key})
	require.NoError(t, err)
	require.Equal(t, residual.Unknown, kept.State)

	again, err := l.Reserve(ctx, done)
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, again.Decision)
	require.Equal(t, uint64(2), again.Lease.Token, "the token counter survives GC")
}

func TestClosedLedger(t *testing.T) {
	t.Parallel()
	l := setup(t)
	require.NoError(t, l.Close())
	require.NoError(t, l.Close())
	_, err := l.Reserve(context.Background(), params("x", "h"))
	require.True(t, errors.Is(err, lease.ErrClosed))
}

// Reserve rebuilds a new residual from what it sent instead of reading it back: what it
// returns must be exactly what is stored, including a TTL finer than the server's
// microseconds.
func TestReserveReturnsWhatItStored(t *testing.T) {
	t.Parallel()
	l := setup(t)
	ctx := context.Background()
	for i, ttl := range []time.Duration{30 * time.Second, 20*time.Second + 1500*time.Nanosecond, 7*time.Minute + 999*time.Nanosecond} {
		p := params(fmt.Sprintf("rebuilt-%d", i), "holder-"+strconv.Itoa(i))
		p.TTL = ttl
		res, err := l.Reserve(ctx, p)
		require.NoError(t, err)
		require.Equal(t, ledger.Acquired, res.Decision)
		got, err := l.Get(ctx, ledger.GetParams{Namespace: p.Namespace, Key: p.Key})
		require.NoError(t, err)
		require.Equal(t, got, res.Residual)
		require.Equal(t, got.Current().LeaseExpires, res.Lease.Expires)
	}
}

// Commit rebuilds the committed residual from what it sent and the columns it did not send:
// what it returns must be exactly what is stored, for every outcome, with earlier attempts,
// a kept result and evidence in the row.
func TestCommitReturnsWhatItStored(t *testing.T) {
	t.Parallel()
	l := setup(t)
	ctx := context.Background()
	check := func(p ledger.ReserveParams, out *residual.Residual) {
		t.Helper()
		got, err := l.Get(ctx, ledger.GetParams{Namespace: p.Namespace, Key: p.Key})
		require.NoError(t, err)
		require.Equal(t, got, out)
	}
	for _, outcome := range []residual.State{residual.Succeeded, residual.Accepted, residual.Failed, residual.Unknown} {
		p := params("committed-"+string(outcome), "holder")
		res, err := l.Reserve(ctx, p)
		require.NoError(t, err)
		cp := commitOf(p, res, outcome)
		cp.Error, cp.ResultTruncated = "tool said "+string(outcome), outcome == residual.Accepted
		if outcome == residual.Accepted {
			cp.Handle = "job-7"
		}
		out, err := l.Commit(ctx, cp)
		require.NoError(t, err)
		check(p, out)
	}

	// A second attempt after an accepted one that was settled failed: the failed commit keeps
	// the stored result, and the row carries a prior attempt and a zombie's evidence.
	p := params("committed-history", "first")
	res, err := l.Reserve(ctx, p)
	require.NoError(t, err)
	_, err = l.Commit(ctx, commitOf(p, res, residual.Failed))
	require.NoError(t, err)
	p2 := p
	p2.Holder = "second"
	res2, err := l.Reserve(ctx, p2)
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, res2.Decision)
	_, err = l.Commit(ctx, commitOf(p, res, residual.Succeeded)) // the first holder, fenced out
	require.ErrorIs(t, err, residual.ErrLeaseLost)
	out, err := l.Commit(ctx, commitOf(p2, res2, residual.Succeeded))
	require.NoError(t, err)
	require.Len(t, out.Attempts, 2)
	require.NotEmpty(t, out.Evidence)
	check(p2, out)
}
