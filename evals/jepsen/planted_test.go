package jepsen

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

// dropsCommits is a planted bug: every third successful-looking commit is acknowledged
// (the residual it returns says so) but never written.
type dropsCommits struct {
	ledger.Ledger
	mu sync.Mutex
	n  int
}

func (d *dropsCommits) Commit(ctx context.Context, p ledger.CommitParams) (*residual.Residual, error) {
	d.mu.Lock()
	d.n++
	drop := d.n%3 == 0
	d.mu.Unlock()
	if !drop {
		return d.Ledger.Commit(ctx, p)
	}
	r, err := d.Ledger.Get(ctx, ledger.GetParams{Namespace: p.Namespace, Key: p.Key})
	if err != nil {
		return nil, err
	}
	cur := r.Current()
	if cur == nil || cur.Token != p.Token || cur.Holder != p.Holder || r.State != residual.Pending {
		return d.Ledger.Commit(ctx, p)
	}
	cur.Outcome, cur.Released, cur.Ended = p.Outcome, true, time.Now()
	r.State = p.Outcome
	return r, nil
}

// repeatsTokens is a planted bug: it reports the previous token on every other acquisition
// of a key that has one, as a ledger that lost its token counter would.
type repeatsTokens struct {
	ledger.Ledger
	mu sync.Mutex
	n  int
}

func (d *repeatsTokens) Reserve(ctx context.Context, p ledger.ReserveParams) (*ledger.ReserveResult, error) {
	res, err := d.Ledger.Reserve(ctx, p)
	if err != nil || res.Decision != ledger.Acquired || res.Lease.Token < 2 {
		return res, err
	}
	d.mu.Lock()
	d.n++
	repeat := d.n%2 == 0
	d.mu.Unlock()
	if repeat {
		res.Lease.Token--
		res.Residual.Token--
		res.Residual.Current().Token--
	}
	return res, nil
}

func openBadger(t *testing.T) ledger.Ledger {
	t.Helper()
	l, err := badger.Open(t.TempDir(), badger.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func shortWorkload() Workload {
	return Workload{Start: time.Now(), Epoch: 2 * time.Second, Slots: 2, GC: true}
}

// TestCheckerPassesACorrectLedger: the same workload on the real ledger checks clean, so the
// planted-bug tests below fail for the bug, not for the model.
func TestCheckerPassesACorrectLedger(t *testing.T) {
	ops := RunInProcess(context.Background(), openBadger(t), 6, shortWorkload(), 3*time.Second, 1)
	v := Check(ops, time.Minute, t.TempDir())
	t.Log(v, v.ByResult)
	if !v.OK() {
		require.NoError(t, WriteHistory(filepath.Join(os.TempDir(), "jepsen-failed-history.jsonl"), ops))
	}
	require.Greater(t, v.Ops, 200)
	require.True(t, v.OK(), "%s\n%v\n%s", v, v.Violations, joined(v.Window))
}

func TestCheckerCatchesDroppedCommit(t *testing.T) {
	l := &dropsCommits{Ledger: openBadger(t)}
	ops := RunInProcess(context.Background(), l, 6, shortWorkload(), 3*time.Second, 2)
	dir := t.TempDir()
	v := Check(ops, time.Minute, dir)
	t.Log(v)
	require.Greater(t, l.n, 3, "the workload committed")
	require.Equal(t, "Illegal", v.Linearizable, "a commit acknowledged and dropped must make the history non-linearizable")
	require.NotEmpty(t, v.Visualization)
	require.FileExists(t, v.Visualization)
}

func TestCheckerCatchesRepeatedToken(t *testing.T) {
	l := &repeatsTokens{Ledger: openBadger(t)}
	ops := RunInProcess(context.Background(), l, 6, shortWorkload(), 3*time.Second, 3)
	v := Check(ops, time.Minute, t.TempDir())
	t.Log(v)
	require.Greater(t, l.n, 2)
	require.False(t, v.OK())
	require.Contains(t, joined(v.Violations), "issued twice")
}

func joined(s []string) string {
	out := ""
	for _, x := range s {
		out += x + "\n"
	}
	return out
}
