package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// A holder whose own clock runs 10 s fast or slow cannot commit after the server-side
// expiry, and can commit before it: the database server's clock decides, never the
// holder's. The skewed clock is the ledger's own (Options.Clock), so a ledger that let its
// client clock decide any expiry would fail here.
func TestClientClockSkewCannotBeatServerExpiry(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{10 * time.Second, -10 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			holderClock := lease.NewFake(time.Now().Add(skew)) // the holder's machine is off by skew
			l := open(t, newSchema(t), postgres.Options{Clock: holderClock})
			ctx := context.Background()
			const ttl = 5 * time.Second

			// Before the server-side expiry the commit lands, whatever the holder's clock says.
			early := params("early:"+skew.String(), "agent-skewed")
			early.TTL = ttl
			res, err := l.Reserve(ctx, early)
			require.NoError(t, err)
			require.Equal(t, ledger.Acquired, res.Decision)
			l.SetTimeOffset(l.TimeOffset() + ttl/2)
			holderClock.Advance(ttl / 2)
			if skew > 0 {
				require.Error(t, res.Lease.CheckMargin(holderClock.Now(), 0), "the fast holder believes its lease has expired")
			}
			_, err = l.Commit(ctx, commitOf(early, res, residual.Succeeded))
			require.NoError(t, err, "the server says the lease is live (holder's view: %v left)", res.Lease.Remaining(holderClock.Now()))

			// After the server-side expiry it is refused, even when the holder's clock says
			// the lease has time left.
			late := params("late:"+skew.String(), "agent-skewed")
			late.TTL = ttl
			res, err = l.Reserve(ctx, late)
			require.NoError(t, err)
			require.Equal(t, ledger.Acquired, res.Decision)
			l.SetTimeOffset(l.TimeOffset() + ttl + time.Second)
			holderClock.Advance(ttl + time.Second)
			holderView := res.Lease.CheckMargin(holderClock.Now(), lease.DefaultMargin)
			if skew < 0 {
				require.NoError(t, holderView, "the slow holder believes its lease is still live")
			} else {
				require.Error(t, holderView, "the fast holder knows its lease is over")
			}
			_, err = l.Renew(ctx, ledger.RenewParams{Namespace: ns, Key: late.Key, Holder: late.Holder, Token: res.Lease.Token, TTL: ttl})
			require.ErrorIs(t, err, residual.ErrLeaseLost)
			_, err = l.Commit(ctx, commitOf(late, res, residual.Succeeded))
			require.ErrorIs(t, err, residual.ErrLeaseLost)

			got, err := l.Get(ctx, ledger.GetParams{Namespace: ns, Key: late.Key})
			require.NoError(t, err)
			require.Equal(t, residual.Unknown, got.State)
			require.Empty(t, got.Result, "the late commit wrote nothing authoritative")
			require.Len(t, got.Evidence, 1, "the late observation is kept as evidence")
			again, err := l.Reserve(ctx, late)
			require.NoError(t, err)
			require.Equal(t, ledger.UnknownOutcome, again.Decision)
		})
	}
}
