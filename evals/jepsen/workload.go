package jepsen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

// namespace is the ledger namespace of every run.
const namespace = "jepsen"

// LedgerKey returns the ledger key of a workload slot.
func LedgerKey(slot string) string {
	return residual.Key(namespace, "task-"+slot, "jepsen.op", slot)
}

// SkewClock is the wall clock shifted by an offset the nemesis sets. It is the lease.Clock
// of the workers' ledgers: for badger it is the ledger's clock; for PostgreSQL it only paces
// client-side waits and what a client believes about its lease (the server's clock decides).
type SkewClock struct{ off atomic.Int64 }

var _ lease.Clock = (*SkewClock)(nil)

// Now returns the wall clock plus the offset.
func (c *SkewClock) Now() time.Time { return time.Now().Add(c.Offset()) }

// After waits d of real time.
func (c *SkewClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Offset returns the current offset.
func (c *SkewClock) Offset() time.Duration { return time.Duration(c.off.Load()) }

// Set sets the offset.
func (c *SkewClock) Set(d time.Duration) { c.off.Store(int64(d)) }

// Workload shapes the clients' steps.
type Workload struct {
	// Start is the run's start (wall clock); keys rotate every Epoch from it.
	Start time.Time
	// Epoch is how long a set of Slots keys is in use before the clients move to fresh
	// ones. It keeps each key's history short for the checker and its evidence under the cap.
	Epoch time.Duration
	// Slots is the number of keys in use at once: few, so that clients collide.
	Slots int
	// GC lets client 0 of each process collect settled residuals now and then.
	GC bool
}

// slot picks one of the slots in use at t.
func (w Workload) slot(t time.Time, r *rand.Rand) string {
	e := int(t.Sub(w.Start) / w.Epoch)
	return fmt.Sprintf("e%dk%d", e, r.IntN(w.Slots))
}

// AllSlots returns every slot name of a run that lasted d.
func (w Workload) AllSlots(d time.Duration) []string {
	var out []string
	for e := 0; e <= int(d/w.Epoch)+1; e++ {
		for k := range w.Slots {
			out = append(out, fmt.Sprintf("e%dk%d", e, k))
		}
	}
	return out
}

// client runs the workload's steps against one ledger and records them.
type client struct {
	id, proc int
	l        ledger.Ledger
	rec      *recorder
	w        Workload
	rng      *rand.Rand
	clock    *SkewClock
	// ledgerOffset returns the offset of the ledger's clock from the wall clock.
	ledgerOffset func() time.Duration
	seq          *atomic.Int64
}

// opTimeout bounds one step; a step cut off is indeterminate.
const opTimeout = 20 * time.Second

// do records the call, runs fn and records its answer.
func (c *client) do(in Input, fn func(ctx context.Context) (*Output, error)) *Output {
	op := &Op{ID: c.seq.Add(1), Proc: c.proc, Client: c.id, In: in}
	op.OffCall = int64(c.ledgerOffset())
	op.Call = time.Now().UnixNano()
	c.rec.emit(event{T: "call", Op: op})
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	out, err := fn(ctx)
	cancel()
	ret := time.Now().UnixNano()
	off := int64(c.ledgerOffset())
	if out == nil {
		out = &Output{}
	}
	out.Result = classify(in.Kind, err)
	if err != nil {
		out.Err = err.Error()
	}
	c.rec.emit(event{T: "ret", ID: op.ID, Out: out, Ret: ret, Off: off})
	return out
}

// classify maps a step's error to its Result.
func classify(k Kind, err error) Result {
	switch {
	case err == nil:
		return ROK
	case errors.Is(err, residual.ErrLeaseLost):
		return RLeaseLost
	case errors.Is(err, residual.ErrNotFound):
		return RNotFound
	case errors.Is(err, residual.ErrInProgress):
		return RInProgress
	case errors.Is(err, residual.ErrInvalidTransition):
		return RInvalidTransition
	case errors.Is(err, ledger.ErrOutcomeUnknown), errors.Is(err, badger.ErrSyncFailed),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return RIndeterminate
	case k == KRenew:
		// The PostgreSQL ledger reports a renewal that may have landed as unavailable (it
		// only extended the lease), so a failed renewal is not a definite no-op.
		return RIndeterminate
	}
	return RFail
}

// describe fills out from a residual.
func describe(out *Output, r *residual.Residual) *Output {
	if out == nil {
		out = &Output{}
	}
	if r == nil {
		return out
	}
	out.HasRes = true
	// AttemptCount counts every attempt; the ledger keeps only some of them in Attempts.
	out.State, out.Token, out.Attempts = r.State, r.Token, max(r.AttemptCount, len(r.Attempts))
	out.Evidence, out.Resolved = len(r.Evidence), len(r.Resolutions)
	if cur := r.Current(); cur != nil {
		out.Holder = cur.Holder
	}
	return out
}

func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// run loops over steps until ctx ends.
func (c *client) run(ctx context.Context) {
	for n := 0; ctx.Err() == nil; n++ {
		slot := c.w.slot(time.Now(), c.rng)
		switch r := c.rng.IntN(100); {
		case r < 50:
			c.reserveFlow(ctx, slot, n)
		case r < 62:
			c.resolve(slot)
		case r < 72:
			c.evidence(slot)
		case r < 96 || !c.w.GC || c.id%2 != 0:
			c.get(slot)
		default:
			c.gc()
		}
		sleep(ctx, time.Duration(c.rng.IntN(10))*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (c *client) reserveFlow(ctx context.Context, slot string, n int) {
	key := LedgerKey(slot)
	holder := fmt.Sprintf("c%d-%d", c.id, n)
	ttl := time.Duration(150+100*c.rng.IntN(5)) * time.Millisecond
	digest := "a"
	if c.rng.IntN(100) < 15 {
		digest = "b"
	}
	in := Input{Kind: KReserve, Key: slot, Holder: holder, Digest: digest, TTL: ttl, Redispatch: c.rng.IntN(100) < 20}
	var l lease.Lease
	out := c.do(in, func(ctx context.Context) (*Output, error) {
		res, err := c.l.Reserve(ctx, ledger.ReserveParams{Namespace: namespace, Key: key, Task: "task-" + slot,
			Operation: "jepsen.op", Target: slot, Holder: holder, RequestDigest: digest, TTL: ttl, Redispatch: in.Redispatch})
		if err != nil {
			return nil, err
		}
		o := describe(&Output{Decision: res.Decision.String()}, res.Residual)
		if res.Decision == ledger.Acquired {
			l = res.Lease
			o.Started, o.Expires = ns(res.Residual.Current().Started), ns(res.Lease.Expires)
		}
		return o, nil
	})
	if out.Result != ROK || out.Decision != ledger.Acquired.String() {
		if out.Decision == ledger.InProgress.String() {
			sleep(ctx, time.Duration(20+c.rng.IntN(80))*time.Millisecond) // back off from the holder
		}
		return
	}
	// Dispatch: mostly short, sometimes longer than the lease, so that late commits happen.
	work := time.Duration(c.rng.Int64N(int64(ttl) / 3))
	if c.rng.IntN(100) < 25 {
		work = time.Duration(c.rng.Int64N(int64(ttl) * 13 / 10))
	}
	if c.rng.IntN(100) < 25 {
		sleep(ctx, work/2)
		work -= work / 2
		ro := c.do(Input{Kind: KRenew, Key: slot, Holder: holder, Token: l.Token, TTL: ttl}, func(ctx context.Context) (*Output, error) {
			nl, err := c.l.Renew(ctx, ledger.RenewParams{Namespace: namespace, Key: key, Holder: holder, Token: l.Token, TTL: ttl})
			if err != nil {
				return nil, err
			}
			return &Output{Expires: ns(nl.Expires)}, nil
		})
		if ro.Result == ROK {
			l.Expires = time.Unix(0, ro.Expires)
		}
	}
	sleep(ctx, work)
	const margin = 20 * time.Millisecond
	switch {
	case c.rng.IntN(100) < 8:
		return // the holder dies before committing: the residual turns unknown
	case l.Remaining(c.clock.Now()) <= margin && c.rng.IntN(2) == 0:
		return // the holder's own (possibly skewed) clock says the lease is gone
	}
	token := l.Token
	if token > 1 && c.rng.IntN(100) < 5 {
		token-- // a zombie holder's stale token
	}
	// Mostly failed, so that keys are taken again; succeeded keys come back after GC.
	outcomes := []residual.State{residual.Succeeded, residual.Failed, residual.Failed, residual.Failed, residual.Accepted, residual.Unknown}
	oc := outcomes[c.rng.IntN(len(outcomes))]
	c.do(Input{Kind: KCommit, Key: slot, Holder: holder, Token: token, Outcome: oc, Margin: margin}, func(ctx context.Context) (*Output, error) {
		p := ledger.CommitParams{Namespace: namespace, Key: key, Holder: holder, Token: token, Outcome: oc,
			ResponseDigest: "resp-" + holder, Margin: margin}
		if oc == residual.Succeeded {
			p.Result, p.ResultDigest = []byte(`{"ok":true}`), "rd-"+holder
		}
		r, err := c.l.Commit(ctx, p)
		o := describe(nil, r)
		if err == nil && r != nil {
			// The end of this token's attempt: a retried commit is answered with the
			// residual as it stands, whose current attempt may be a later holder's.
			for _, a := range r.Attempts {
				if a.Token == token {
					o.Ended = ns(a.Ended)
				}
			}
		}
		return o, err
	})
}

func (c *client) resolve(slot string) {
	as := residual.Succeeded
	if c.rng.IntN(2) == 0 {
		as = residual.Failed
	}
	// Resolvers share names and notes, so identical resolutions race.
	by := fmt.Sprintf("reconciler-%d", c.rng.IntN(2))
	in := Input{Kind: KResolve, Key: slot, As: as, By: by, Note: "probe"}
	c.do(in, func(ctx context.Context) (*Output, error) {
		r, err := c.l.Resolve(ctx, ledger.ResolveParams{Namespace: namespace, Key: LedgerKey(slot), As: as, By: by, Note: "probe", Evidence: "jepsen"})
		out := describe(nil, r)
		if r != nil && len(r.Resolutions) > 0 && r.Resolutions[len(r.Resolutions)-1].Token == r.Token {
			out.Issued = r.Token
		}
		return out, err
	})
}

func (c *client) evidence(slot string) {
	// Identical observations from different clients, as two reconcilers would record them.
	note := fmt.Sprintf("seen-%d", c.rng.IntN(2))
	c.do(Input{Kind: KEvidence, Key: slot, Note: note}, func(ctx context.Context) (*Output, error) {
		r, err := c.l.AppendEvidence(ctx, ledger.EvidenceParams{Namespace: namespace, Key: LedgerKey(slot),
			Evidence: residual.Evidence{Holder: "observer", Note: note}})
		return describe(nil, r), err
	})
}

func (c *client) get(slot string) {
	c.do(Input{Kind: KGet, Key: slot}, func(ctx context.Context) (*Output, error) {
		r, err := c.l.Get(ctx, ledger.GetParams{Namespace: namespace, Key: LedgerKey(slot)})
		return describe(nil, r), err
	})
}

func (c *client) gc() {
	c.do(Input{Kind: KGC}, func(ctx context.Context) (*Output, error) {
		// Far in the future on any skewed clock: every settled residual is collectable.
		_, err := c.l.GC(ctx, ledger.GCParams{Namespace: namespace, Before: time.Now().Add(1000 * time.Hour)})
		return nil, err
	})
}

type atomicSeq struct{ v atomic.Int64 }

func (a *atomicSeq) p(start int64) *atomic.Int64 {
	a.v.Store(start)
	return &a.v
}
