package postgres

import (
	"context"

	"github.com/toolfence/toolfence/ledger"
)

// ListQuery exposes the statement List runs for p, for plan checks.
func ListQuery(p ledger.ListParams) (string, []any) {
	return listQuery(p, 100, 0)
}

// BarrierSQL is the statement a retried write waits on before it answers.
const BarrierSQL = barrierSQL

// OpenSQL is the statement OpenResiduals runs ($1: offset µs).
var OpenSQL = openSQL

// HoldGroups takes the slot of l's reserve and commit groups, so that Reserves and Commits
// started meanwhile queue (Queued counts them); release lets the queue run, as shared
// statements. From then on l's calls queue behind a busy step however few are in flight
// (as above the load shareAbove); TestFewCallsRunBesideABusyStep uses HoldSlots instead.
func HoldGroups(l *Ledger) (release func()) {
	l.reserves.setAbove(0)
	l.commits.setAbove(0)
	return holdSlots(l)
}

func (g *group[J]) setAbove(n int64) {
	g.mu.Lock()
	g.above = n
	g.mu.Unlock()
}

// HoldSlots is HoldGroups with l's load rule left as it is.
func HoldSlots(l *Ledger) (release func()) { return holdSlots(l) }

// AddLoad counts n more (or, negative, fewer) calls in flight in l, as its groups see them.
func AddLoad(l *Ledger, n int64) { l.calls.Add(n) }

func holdSlots(l *Ledger) (release func()) {
	r, c := &reserveJob{}, &commitJob{}
	if alone, _ := l.reserves.join(context.Background(), r); !alone || r.sh.hold == nil {
		panic("the reserve group is busy")
	}
	if alone, _ := l.commits.join(context.Background(), c); !alone || c.sh.hold == nil {
		panic("the commit group is busy")
	}
	r.sh.hold.Stop() // held until release, however long the test takes
	c.sh.hold.Stop()
	return func() {
		l.reserves.release(r)
		l.commits.release(c)
	}
}

// Queued returns how many Reserves and Commits wait in l's groups.
func Queued(l *Ledger) (reserves, commits int) {
	l.reserves.mu.Lock()
	reserves = len(l.reserves.queue)
	l.reserves.mu.Unlock()
	l.commits.mu.Lock()
	commits = len(l.commits.queue)
	l.commits.mu.Unlock()
	return reserves, commits
}
