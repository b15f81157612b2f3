package badger

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	dbadger "github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// indexState returns the filter index entries of the store and the entries its residuals
// call for, each sorted.
func indexState(t *testing.T, db *dbadger.DB) (have, want []string) {
	t.Helper()
	require.NoError(t, db.View(func(txn *dbadger.Txn) error {
		it := txn.NewIterator(dbadger.IteratorOptions{PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			switch {
			case len(k) > 2 && string(k[:2]) == indexPrefix:
				have = append(have, string(k))
			case len(k) > 2 && string(k[:2]) == residualPrefix:
				var r residual.Residual
				require.NoError(t, it.Item().Value(func(v []byte) error { return json.Unmarshal(v, &r) }))
				for _, p := range fixedPrefixes(&r) {
					want = append(want, string(indexKey(p, r.Key)))
				}
				if r.State.Open() {
					want = append(want, string(indexKey(fieldPrefix(r.Namespace, fieldOpen, ""), r.Key)))
				}
			}
		}
		return nil
	}))
	slices.Sort(have)
	slices.Sort(want)
	return have, want
}

// lifecycle drives residuals of namespace ns through every step that writes one: reserve,
// commit (each outcome), a refused commit, renew, evidence, a new attempt after failure, an
// expired lease, resolve and GC.
func lifecycle(t *testing.T, l *Ledger, clock *lease.Fake, ns string) {
	t.Helper()
	ctx := t.Context()
	p := func(i int) ledger.ReserveParams {
		task, op, target := fmt.Sprint("task-", i%3), fmt.Sprint("op-", i%2), fmt.Sprint("item:", i)
		return ledger.ReserveParams{Namespace: ns, Key: residual.Key(ns, task, op, target), Task: task, Operation: op,
			Target: target, Holder: "agent", RequestDigest: "d", TTL: time.Minute}
	}
	commit := func(rp ledger.ReserveParams, token uint64, s residual.State) error {
		_, err := l.Commit(ctx, ledger.CommitParams{Namespace: ns, Key: rp.Key, Holder: rp.Holder, Token: token, Outcome: s})
		return err
	}
	tokens := map[int]uint64{}
	for i := range 12 {
		res, err := l.Reserve(ctx, p(i))
		require.NoError(t, err)
		tokens[i] = res.Lease.Token
	}
	outcomes := []residual.State{residual.Succeeded, residual.Failed, residual.Accepted, residual.Unknown}
	for i := range 8 {
		require.NoError(t, commit(p(i), tokens[i], outcomes[i%4]))
	}
	require.Error(t, commit(p(0), tokens[0], residual.Failed), "refused: writes evidence")
	_, err := l.Renew(ctx, ledger.RenewParams{Namespace: ns, Key: p(8).Key, Holder: "agent", Token: tokens[8], TTL: time.Hour})
	require.NoError(t, err)
	_, err = l.AppendEvidence(ctx, ledger.EvidenceParams{Namespace: ns, Key: p(9).Key, Evidence: residual.Evidence{Note: "seen"}})
	require.NoError(t, err)
	res, err := l.Reserve(ctx, p(1)) // failed: a new attempt
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, res.Decision)
	clock.Advance(2 * time.Minute) // 10, 11 and 1 expire: unknown
	for _, i := range []int{3, 10} {
		_, err := l.Resolve(ctx, ledger.ResolveParams{Namespace: ns, Key: p(i).Key, As: residual.Failed, By: "op"})
		require.NoError(t, err)
	}
	clock.Advance(time.Minute)
	gc, err := l.GC(ctx, ledger.GCParams{Namespace: ns, Before: clock.Now()})
	require.NoError(t, err)
	require.Equal(t, 5, gc.Deleted, "succeeded 0 and 4, failed 5, resolved 3 and 10")
}

// Every step keeps the filter index equal to what the residuals call for, in its own
// transaction: after a lifecycle that creates, settles, reopens, resolves and collects
// residuals, the index holds exactly the entries of the residuals left.
func TestFilterIndexFollowsEveryStep(t *testing.T) {
	t.Parallel()
	clock := lease.NewFake(start)
	l := openTest(t, t.TempDir(), Options{Clock: clock})
	lifecycle(t, l, clock, "ns")
	have, want := indexState(t, l.db)
	require.Len(t, want, 7*4, "7 residuals left, all open")
	require.Equal(t, want, have)
}

// A store written by a toolfence without the filter index (no entries, no version marker)
// gets the index when opened, and its filtered listings find what is there; a build that
// was interrupted (stray entries, no marker) is done again from scratch.
func TestFilterIndexBuiltOnUpgrade(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	clock := lease.NewFake(start)
	l, err := Open(dir, Options{Clock: clock})
	require.NoError(t, err)
	lifecycle(t, l, clock, "ns")
	require.NoError(t, l.Close())

	// What an older toolfence left: the same residuals, no index, no marker, and (as an
	// interrupted build would) one stray entry.
	db, err := dbadger.Open(dbadger.DefaultOptions(dir).WithLogger(nil))
	require.NoError(t, err)
	require.NoError(t, db.DropPrefix([]byte(indexPrefix)))
	require.NoError(t, db.Update(func(txn *dbadger.Txn) error {
		if err := txn.Delete([]byte(indexVersionKey)); err != nil {
			return err
		}
		return txn.Set(indexKey(fieldPrefix("ns", fieldTask, "task-0"), residual.Key("ns", "gone", "gone", "gone")), nil)
	}))
	have, want := indexState(t, db)
	require.Len(t, have, 1)
	require.NotEmpty(t, want)
	require.NoError(t, db.Close())

	l = openTest(t, dir, Options{Clock: clock})
	have, want = indexState(t, l.db)
	require.Equal(t, want, have, "Open built the index")
	open := []residual.State{residual.Pending, residual.Unknown, residual.Accepted}
	page, err := l.List(t.Context(), ledger.ListParams{Namespace: "ns", Task: "task-2", States: open})
	require.NoError(t, err)
	var got []string
	for _, r := range page.Residuals {
		got = append(got, r.Target)
	}
	require.Equal(t, []string{"item:11", "item:2", "item:8"}, sortedTargets(got))

	// Opening again does not rebuild: the marker says the index is complete.
	require.NoError(t, l.Close())
	l = openTest(t, dir, Options{Clock: clock})
	have, want = indexState(t, l.db)
	require.Equal(t, want, have)
}

func sortedTargets(ts []string) []string {
	slices.Sort(ts)
	return ts
}

// A store whose filter index is of a version this binary does not know is refused, naming
// the problem, and left as it is.
func TestFilterIndexTooNewRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := Open(dir, Options{})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	db, err := dbadger.Open(dbadger.DefaultOptions(dir).WithLogger(nil))
	require.NoError(t, err)
	require.NoError(t, db.Update(func(txn *dbadger.Txn) error { return txn.Set([]byte(indexVersionKey), []byte("2")) }))
	require.NoError(t, db.Close())
	_, err = Open(dir, Options{})
	require.ErrorContains(t, err, `filter index version "2": this binary knows version 1; upgrade toolfence`)
}
