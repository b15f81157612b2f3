package ledgertest

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/rules"
	"github.com/toolfence/toolfence/residual"
)

var reserveCases = []testCase{
	{"ReserveNewKeyAcquires", reserveNewKeyAcquires},
	{"ReserveConcurrentOneWinner", reserveConcurrentOneWinner},
	{"ReserveWhileLiveIsInProgress", reserveWhileLiveIsInProgress},
	{"ReserveAfterExpiryIsUnknown", reserveAfterExpiryIsUnknown},
	{"RedispatchSameDigestAcquires", redispatchSameDigestAcquires},
	{"RedispatchOtherDigestIsUnknown", redispatchOtherDigestIsUnknown},
	{"AttemptsAreBounded", attemptsAreBounded},
}

// A key that keeps failing does not grow without limit: after 600 begin → failed commit
// cycles the residual keeps the first attempt and the latest rules.KeepAttempts, and
// AttemptCount says 600 (also in its JSON form); numbering and tokens stay absolute.
func attemptsAreBounded(e *env) {
	const cycles = 600
	c := e.call("charge:flaky")
	var last *ledger.ReserveResult
	for i := range cycles {
		last = e.acquire(c.reserve(fmt.Sprint("agent-", i%3), "digest-1"))
		require.Equal(e.t, i+1, last.Residual.Current().N)
		p := c.commit(last.Lease.Holder, last.Lease.Token, residual.Failed)
		p.Error = "upstream said no"
		e.commit(p)
	}
	kept := 1 + rules.KeepAttempts
	for name, r := range map[string]*residual.Residual{"get": e.get(c), "list": e.list(ledger.ListParams{Namespace: c.ns})[0], "reserve": last.Residual} {
		require.Len(e.t, r.Attempts, kept, name)
		require.Equal(e.t, cycles, r.AttemptCount, name)
		require.Equal(e.t, 1, r.Attempts[0].N, "%s: the first attempt is kept", name)
		require.Equal(e.t, "agent-0", r.Attempts[0].Holder, name)
		for j, a := range r.Attempts[1:] {
			require.Equal(e.t, cycles-rules.KeepAttempts+1+j, a.N, "%s: the latest attempts are kept in order", name)
		}
	}
	got := e.get(c)
	require.Equal(e.t, last.Lease.Token, got.Current().Token)
	b, err := json.Marshal(got)
	require.NoError(e.t, err)
	require.Contains(e.t, string(b), fmt.Sprintf(`"attempt_count":%d`, cycles))

	next := e.acquire(c.reserve("agent-z", "digest-1"))
	require.Greater(e.t, next.Lease.Token, last.Lease.Token)
	require.Equal(e.t, cycles+1, next.Residual.AttemptCount)
	require.Len(e.t, next.Residual.Attempts, kept)
}

// A reserve on a new key acquires attempt 1 under token 1 with expiry now+TTL, and the
// pending residual can be read back and listed.
func reserveNewKeyAcquires(e *env) {
	c := e.call("email:bob@example.com")
	before := e.now()
	res := e.acquire(c.reserve("agent-a", "digest-1"))
	after := e.now()

	r := res.Residual
	require.Equal(e.t, residual.Pending, r.State)
	require.Equal(e.t, c.key(), r.Key)
	require.Equal(e.t, c.ns, r.Namespace)
	require.Equal(e.t, c.task, r.Task)
	require.Equal(e.t, c.op, r.Operation)
	require.Equal(e.t, c.target, r.Target)
	require.Equal(e.t, "digest-1", r.RequestDigest)
	require.Equal(e.t, uint64(1), r.Token, "first token of a key is 1")
	require.Len(e.t, r.Attempts, 1)
	a := r.Attempts[0]
	require.Equal(e.t, 1, a.N)
	require.Equal(e.t, "agent-a", a.Holder)
	require.Equal(e.t, uint64(1), a.Token)
	require.Equal(e.t, residual.None, a.Outcome)
	require.False(e.t, a.Released)

	l := res.Lease
	require.Equal(e.t, c.key(), l.Resource)
	require.Equal(e.t, "agent-a", l.Holder)
	require.Equal(e.t, uint64(1), l.Token)
	e.requireTimeBetween(before.Add(ttl), after.Add(ttl), l.Expires, "lease expiry is now+TTL")
	e.requireTime(l.Expires, a.LeaseExpires, "attempt records the lease expiry")

	got := e.get(c)
	require.Equal(e.t, residual.Pending, got.State)
	require.Equal(e.t, uint64(1), got.Token)
	require.Len(e.t, got.Attempts, 1)
	require.Equal(e.t, "agent-a", got.Attempts[0].Holder)
	e.requireTime(l.Expires, got.Attempts[0].LeaseExpires, "stored lease expiry")

	listed := e.list(ledger.ListParams{Namespace: c.ns})
	require.Equal(e.t, []string{c.key()}, keys(listed))
	require.Equal(e.t, residual.Pending, listed[0].State)
}

// 64 goroutines reserving one key at once: exactly one acquires, every other one is told
// the key is in progress under the winner.
func reserveConcurrentOneWinner(e *env) {
	c := e.call("invoice:INV-42")
	winner := e.oneWinner(64, func(i int) ledger.ReserveParams { return c.reserve(fmt.Sprintf("agent-%02d", i), "digest-1") })
	got := e.get(c)
	require.Len(e.t, got.Attempts, 1, "losers write no attempt")
	require.Equal(e.t, uint64(1), got.Token, "losers take no token")
	require.Equal(e.t, winner, got.Attempts[0].Holder)
}

// oneWinner runs n reserves, params(i) for i in [0, n), at once and requires that exactly
// one acquires and every other one is told the key is in progress under the winner, with no
// lease. It returns the winner's holder.
func (e *env) oneWinner(n int, params func(i int) ledger.ReserveParams) string {
	e.t.Helper()
	start := make(chan struct{})
	results := make([]*ledger.ReserveResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = e.l.Reserve(e.ctx, params(i))
		})
	}
	close(start)
	wg.Wait()

	winner := ""
	acquired := 0
	for i := range n {
		require.NoError(e.t, errs[i], "reserve %d", i)
		if results[i].Decision == ledger.Acquired {
			acquired++
			winner = results[i].Lease.Holder
		}
	}
	require.Equal(e.t, 1, acquired, "exactly one concurrent reserve acquires")
	for i := range n {
		if results[i].Decision == ledger.Acquired {
			continue
		}
		require.Equal(e.t, ledger.InProgress, results[i].Decision, "reserve %d", i)
		require.Equal(e.t, winner, results[i].Residual.Current().Holder, "in-progress names the winner")
		require.Zero(e.t, results[i].Lease, "no lease without acquiring")
	}
	return winner
}

// A second reserve while the first lease is live is InProgress, names the holder and
// writes nothing.
func reserveWhileLiveIsInProgress(e *env) {
	c := e.call("ticket:T-1")
	first := e.acquire(c.reserve("agent-a", "digest-1"))

	for _, digest := range []string{"digest-1", "digest-2"} {
		res := e.reserve(c.reserve("agent-b", digest))
		require.Equal(e.t, ledger.InProgress, res.Decision)
		require.ErrorIs(e.t, res.Decision.Err(), residual.ErrInProgress)
		require.Equal(e.t, residual.Pending, res.Residual.State)
		require.Equal(e.t, "agent-a", res.Residual.Current().Holder)
		require.Equal(e.t, first.Lease.Token, res.Residual.Current().Token)
		require.Equal(e.t, lease.Lease{}, res.Lease)
	}
	got := e.get(c)
	require.Len(e.t, got.Attempts, 1)
	require.Equal(e.t, uint64(1), got.Token)
}

// After the lease expires the residual reads unknown, and a reserve without Redispatch is
// UnknownOutcome whatever its digest.
func reserveAfterExpiryIsUnknown(e *env) {
	c := e.call("deploy:api")
	e.acquire(c.reserve("agent-a", "digest-1"))
	e.advance(pastTTL)

	got := e.get(c)
	require.Equal(e.t, residual.Unknown, got.State, "an expired pending reads as unknown")

	for _, digest := range []string{"digest-1", "digest-2"} {
		res := e.reserve(c.reserve("agent-b", digest))
		require.Equal(e.t, ledger.UnknownOutcome, res.Decision)
		require.ErrorIs(e.t, res.Decision.Err(), residual.ErrUnknownOutcome)
		require.Equal(e.t, residual.Unknown, res.Residual.State)
		require.Equal(e.t, "agent-a", res.Residual.Current().Holder)
	}
	got = e.get(c)
	require.Len(e.t, got.Attempts, 1, "an unknown outcome blocks new attempts")
	require.Equal(e.t, uint64(1), got.Token)
}

// Redispatch with the same digest over an unknown residual acquires attempt 2 under a
// higher token and records attempt 1 as ended unknown.
func redispatchSameDigestAcquires(e *env) {
	c := e.call("webhook:order-7")
	first := e.acquire(c.reserve("agent-a", "digest-1"))
	e.advance(pastTTL)

	p := c.reserve("agent-b", "digest-1")
	p.Redispatch = true
	res := e.acquire(p)
	require.Greater(e.t, res.Lease.Token, first.Lease.Token, "a new attempt gets a higher token")
	require.Equal(e.t, "agent-b", res.Lease.Holder)
	r := res.Residual
	require.Equal(e.t, residual.Pending, r.State)
	require.Equal(e.t, res.Lease.Token, r.Token)
	require.Len(e.t, r.Attempts, 2)
	require.Equal(e.t, 2, r.Attempts[1].N)
	require.Equal(e.t, "agent-b", r.Attempts[1].Holder)
	require.Equal(e.t, residual.Unknown, r.Attempts[0].Outcome, "the expired attempt ended unknown")

	got := e.get(c)
	require.Equal(e.t, residual.Pending, got.State)
	require.Len(e.t, got.Attempts, 2)
	require.Equal(e.t, res.Lease.Token, got.Token)
}

// Redispatch with another digest over an unknown residual stays UnknownOutcome: only the
// same request may be re-sent under the same upstream key.
func redispatchOtherDigestIsUnknown(e *env) {
	c := e.call("webhook:order-8")
	e.acquire(c.reserve("agent-a", "digest-1"))
	e.advance(pastTTL)

	p := c.reserve("agent-b", "digest-2")
	p.Redispatch = true
	res := e.reserve(p)
	require.Equal(e.t, ledger.UnknownOutcome, res.Decision)
	got := e.get(c)
	require.Len(e.t, got.Attempts, 1)
	require.Equal(e.t, uint64(1), got.Token)
	require.Equal(e.t, residual.Unknown, got.State)
}
