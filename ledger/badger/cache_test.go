package badger

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// succeed reserves p and commits it as succeeded with result, returning the token.
func succeed(t *testing.T, l *Ledger, p ledger.ReserveParams, result string) uint64 {
	t.Helper()
	res, err := l.Reserve(t.Context(), p)
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, res.Decision)
	_, err = l.Commit(t.Context(), ledger.CommitParams{
		Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
		Outcome: residual.Succeeded, Result: []byte(result),
	})
	require.NoError(t, err)
	return res.Lease.Token
}

func reserveDecision(t *testing.T, l *Ledger, p ledger.ReserveParams) *ledger.ReserveResult {
	t.Helper()
	res, err := l.Reserve(t.Context(), p)
	require.NoError(t, err)
	return res
}

func cacheCounts(l *Ledger) (hits, fills uint64) {
	l.cache.mu.Lock()
	defer l.cache.mu.Unlock()
	return l.cache.hits, l.cache.fills
}

// A replay fills the cache; later replays and payload mismatches are served from it, as
// private copies; GC evicts the entry, and the key is then reserved again with a higher
// token.
func TestReplayCacheServesCopiesAndGCEvicts(t *testing.T) {
	clock := lease.NewFake(start)
	l := openTest(t, t.TempDir(), Options{Clock: clock})
	p := reserveParams("cached")
	token := succeed(t, l, p, `{"charge":"ch_1"}`)

	res := reserveDecision(t, l, p)
	require.Equal(t, ledger.Replay, res.Decision)
	require.Equal(t, 1, l.cache.len(), "the replay filled the cache")
	res.Residual.Result[0] = 'X' // the caller's copy is its own
	res.Residual.Attempts[0].Holder = "mallory"

	res = reserveDecision(t, l, p)
	require.Equal(t, ledger.Replay, res.Decision)
	require.Equal(t, `{"charge":"ch_1"}`, string(res.Residual.Result))
	require.Equal(t, "agent", res.Residual.Attempts[0].Holder)
	require.Equal(t, residual.Succeeded, res.Residual.State)
	other := p
	other.RequestDigest = "other"
	require.Equal(t, ledger.PayloadMismatch, reserveDecision(t, l, other).Decision)
	hits, fills := cacheCounts(l)
	require.Equal(t, uint64(2), hits)
	require.Equal(t, uint64(1), fills)

	clock.Advance(time.Hour)
	gc, err := l.GC(t.Context(), ledger.GCParams{Namespace: p.Namespace, Before: clock.Now()})
	require.NoError(t, err)
	require.Equal(t, 1, gc.Deleted)
	require.Zero(t, l.cache.len(), "GC evicted the collected residual")
	res = reserveDecision(t, l, p)
	require.Equal(t, ledger.Acquired, res.Decision, "a collected key is free, not replayed from the cache")
	require.Greater(t, res.Lease.Token, token)
}

// Writes to a succeeded key (a refused late commit, AppendEvidence) evict it, so the next
// replay shows the evidence.
func TestReplayCacheEvictedByWrites(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{Clock: lease.NewFake(start)})
	p := reserveParams("evidence")
	token := succeed(t, l, p, `{"ok":true}`)
	require.Equal(t, ledger.Replay, reserveDecision(t, l, p).Decision)
	require.Equal(t, 1, l.cache.len())

	_, err := l.Commit(t.Context(), ledger.CommitParams{
		Namespace: p.Namespace, Key: p.Key, Holder: "zombie", Token: token,
		Outcome: residual.Succeeded, Result: []byte(`{"late":true}`),
	})
	require.ErrorIs(t, err, residual.ErrLeaseLost)
	require.Zero(t, l.cache.len(), "the refused commit wrote evidence and evicted the key")
	res := reserveDecision(t, l, p)
	require.Equal(t, ledger.Replay, res.Decision)
	require.Len(t, res.Residual.Evidence, 1)

	_, err = l.AppendEvidence(t.Context(), ledger.EvidenceParams{
		Namespace: p.Namespace, Key: p.Key, Evidence: residual.Evidence{Holder: "probe", Note: "seen upstream"},
	})
	require.NoError(t, err)
	res = reserveDecision(t, l, p)
	require.Len(t, res.Residual.Evidence, 2, "AppendEvidence evicted the key")
}

// A supersede of a cached success is decided in the read-write transaction, not answered
// from the cache: it acquires, evicts the key, and the next reserve is in progress, not a
// replay of the superseded success. A stale supersede is answered from the cache.
func TestReplayCacheSupersede(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{Clock: lease.NewFake(start)})
	p := reserveParams("superseded")
	token := succeed(t, l, p, `{"v":1}`)
	require.Equal(t, ledger.Replay, reserveDecision(t, l, p).Decision)
	require.Equal(t, 1, l.cache.len())

	stale := p
	stale.Supersede = token + 1
	require.Equal(t, ledger.Replay, reserveDecision(t, l, stale).Decision)
	hits, _ := cacheCounts(l)
	require.Equal(t, uint64(1), hits, "a stale supersede is answered from the cache")

	sup := p
	sup.Holder, sup.Supersede = "successor", token
	res := reserveDecision(t, l, sup)
	require.Equal(t, ledger.Acquired, res.Decision)
	require.Greater(t, res.Lease.Token, token)
	require.Zero(t, l.cache.len(), "the new attempt evicted the success")
	again := reserveDecision(t, l, p)
	require.Equal(t, ledger.InProgress, again.Decision)
	require.Equal(t, "successor", again.Residual.Current().Holder)
	require.Equal(t, ledger.InProgress, reserveDecision(t, l, sup).Decision, "the same supersede again is in progress")
}

// While a write holds a key (from before its commit until after), get misses it and add
// refuses it, so no replay comes from a record the commit replaces; the release evicts it.
func TestReplayCacheHold(t *testing.T) {
	c := newReplayCache(1 << 20)
	r := &residual.Residual{State: residual.Succeeded}
	c.add("a", r, 100, c.stamp("a"))
	require.Same(t, r, c.get("a"))

	c.hold([]string{"a"})
	require.Nil(t, c.get("a"), "held: evicted")
	c.add("a", r, 100, c.stamp("a"))
	require.Nil(t, c.get("a"), "held: a fill is refused even with a fresh stamp")
	c.hold([]string{"a"}) // a second write to the same stripe
	c.release([]string{"a"})
	c.add("a", r, 100, c.stamp("a"))
	require.Nil(t, c.get("a"), "still held by the second write")
	c.release([]string{"a"})

	stamp := c.stamp("a")
	c.add("a", r, 100, stamp)
	require.Same(t, r, c.get("a"), "released: filled again")
}

// A fill whose read may predate a write to its key is refused; other stripes are not
// affected; the budget evicts the least recently used entry and refuses oversize ones.
func TestReplayCacheFillRules(t *testing.T) {
	c := newReplayCache(3 * (100 + cacheEntryOverhead + 8)) // three entries with short keys
	r := &residual.Residual{State: residual.Succeeded}

	stamp := c.stamp("a")
	c.evict([]string{"a"}) // a write to "a" committed after the filler's read began
	c.add("a", r, 100, stamp)
	require.Nil(t, c.get("a"), "a possibly stale fill is refused")
	c.add("a", r, 100, c.stamp("a"))
	require.Same(t, r, c.get("a"))

	var other string
	for i := 0; ; i++ {
		other = fmt.Sprint("k", i)
		if c.stripe(other) != c.stripe("a") {
			break
		}
	}
	stamp = c.stamp(other)
	c.evict([]string{"a"})
	c.add(other, r, 100, stamp)
	require.NotNil(t, c.get(other), "an eviction in another stripe does not refuse the fill")
	require.Nil(t, c.get("a"))

	for _, k := range []string{"b", "c"} {
		c.add(k, r, 100, c.stamp(k))
	}
	require.NotNil(t, c.get(other)) // now most recently used
	c.add("d", r, 100, c.stamp("d"))
	require.Equal(t, 3, c.len())
	require.Nil(t, c.get("b"), "the least recently used entry went first")
	require.NotNil(t, c.get(other))
	c.add("huge", r, int(c.budget), c.stamp("huge"))
	require.Nil(t, c.get("huge"), "an entry over the budget is not cached")

	off := newReplayCache(-1)
	off.add("a", r, 1, off.stamp("a"))
	require.Nil(t, off.get("a"), "a negative budget disables the cache")
}

// The read-only try never reserves: for a free key it returns nothing and writes nothing,
// and Reserve then acquires in the read-write transaction. For every other decision it
// answers without committing anything or running a sync round.
func TestReserveReadNeverAcquires(t *testing.T) {
	clock := lease.NewFake(start)
	l := openTest(t, t.TempDir(), Options{Clock: clock})
	ctx := t.Context()

	free := func(p ledger.ReserveParams, why string) {
		t.Helper()
		before := l.gs.committed()
		res, err := l.reserveRead(ctx, p)
		require.NoError(t, err)
		require.Nil(t, res, "%s: the read-only try leaves Acquired to the write path", why)
		require.Equal(t, before+1, l.gs.committed(), "%s: nothing committed, no round", why)
		got, err := l.Reserve(ctx, p)
		require.NoError(t, err)
		require.Equal(t, ledger.Acquired, got.Decision, why)
	}
	answered := func(p ledger.ReserveParams, want ledger.Decision) {
		t.Helper()
		before := l.gs.committed()
		res, err := l.reserveRead(ctx, p)
		require.NoError(t, err)
		require.NotNil(t, res)
		require.Equal(t, want, res.Decision)
		require.Equal(t, before+1, l.gs.committed(), "%s: nothing committed, no round", want)
	}

	none := reserveParams("none")
	_, err := l.Get(ctx, ledger.GetParams{Namespace: none.Namespace, Key: none.Key})
	require.ErrorIs(t, err, residual.ErrNotFound)
	free(none, "no residual")
	answered(none, ledger.InProgress)

	failed := reserveParams("failed")
	res, err := l.Reserve(ctx, failed)
	require.NoError(t, err)
	_, err = l.Commit(ctx, ledger.CommitParams{
		Namespace: failed.Namespace, Key: failed.Key, Holder: failed.Holder, Token: res.Lease.Token,
		Outcome: residual.Failed,
	})
	require.NoError(t, err)
	free(failed, "failed")

	clock.Advance(2 * time.Minute) // both pending leases expire: unknown
	answered(none, ledger.UnknownOutcome)
	redispatch := none
	redispatch.Redispatch = true
	free(redispatch, "unknown with redispatch")

	done := reserveParams("done")
	token := succeed(t, l, done, `{}`)
	answered(done, ledger.Replay)
	answered(done, ledger.Replay) // from the cache
	mismatch := done
	mismatch.RequestDigest = "other"
	answered(mismatch, ledger.PayloadMismatch)
	hits, _ := cacheCounts(l)
	require.Equal(t, uint64(2), hits)
	supersede := done
	supersede.Supersede = token
	free(supersede, "succeeded, superseded by its token (cached)")
}

// A replay read from a commit whose sync round has not finished waits for a round of its
// own before answering, and only then fills the cache.
func TestReplayWaitsForDurableRead(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{Clock: lease.NewFake(start)})
	p := reserveParams("racing")
	res, err := l.Reserve(t.Context(), p)
	require.NoError(t, err)

	entered, release := make(chan struct{}), make(chan struct{})
	orig := l.gs.sync
	l.gs.sync = func() error {
		entered <- struct{}{}
		<-release
		return orig()
	}
	commitDone := make(chan error, 1)
	go func() {
		_, err := l.Commit(context.Background(), ledger.CommitParams{
			Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
			Outcome: residual.Succeeded, Result: []byte(`{"ok":true}`),
		})
		commitDone <- err
	}()
	<-entered // the commit is visible; its round is blocked
	l.gs.mu.Lock()
	commitSeq := l.gs.taken
	l.gs.mu.Unlock()

	replayDone := make(chan *ledger.ReserveResult, 1)
	go func() {
		res, err := l.Reserve(context.Background(), p)
		if err != nil {
			res = nil
		}
		replayDone <- res
	}()
	// The replay asks for a round of its own (it takes a sequence) once it has read.
	for {
		l.gs.mu.Lock()
		taken := l.gs.taken
		l.gs.mu.Unlock()
		if taken > commitSeq {
			break
		}
		runtime.Gosched()
	}
	require.Zero(t, l.cache.len())
	select {
	case <-replayDone:
		t.Fatal("replay answered from a commit that is not durable yet")
	default:
	}
	release <- struct{}{} // the commit's round
	require.NoError(t, <-commitDone)
	<-entered // the replay's round: it started after the replay read
	select {
	case <-replayDone:
		t.Fatal("replay answered before its own round finished")
	default:
	}
	release <- struct{}{}
	got := <-replayDone
	require.NotNil(t, got)
	require.Equal(t, ledger.Replay, got.Decision)
	require.Equal(t, 1, l.cache.len(), "filled once durable")
	l.gs.sync = orig
}

// Concurrent replays never leave a stale record in the cache: after each acknowledged
// write, every later replay sees it.
func TestReplayCacheConcurrentWrites(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{Clock: lease.NewFake(start)})
	p := reserveParams("hot")
	succeed(t, l, p, `{"ok":true}`)
	ctx := t.Context()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				res, err := l.Reserve(ctx, p)
				if !assert.NoError(t, err) || !assert.Equal(t, ledger.Replay, res.Decision) {
					return
				}
			}
		})
	}
	const writes = 20
	for i := range writes {
		_, err := l.AppendEvidence(ctx, ledger.EvidenceParams{
			Namespace: p.Namespace, Key: p.Key, Evidence: residual.Evidence{Holder: "probe", Note: fmt.Sprint(i)},
		})
		require.NoError(t, err)
		res := reserveDecision(t, l, p)
		require.Len(t, res.Residual.Evidence, i+1, "the replay after write %d sees it", i)
	}
	close(stop)
	wg.Wait()
	hits, fills := cacheCounts(l)
	t.Logf("cache hits %d, fills %d", hits, fills)
}
