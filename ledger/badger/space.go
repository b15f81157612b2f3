package badger

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolfence/toolfence/ledger"
)

// ErrLowSpace is wrapped by Reserve's error when the store's filesystem has less free
// space than the reserve of GuardSpace: nothing was written and nothing may be dispatched.
var ErrLowSpace = errors.New("badger: the store's filesystem is low on free space; new reservations are refused")

// DefaultMinFree is the free space GuardSpace keeps for commits of calls in flight and for
// badger's own flushes and compactions.
const DefaultMinFree = 256 << 20

// FreeSpace returns the bytes available on the filesystem that holds dir.
type FreeSpace func(dir string) (uint64, error)

// Guarded is a Ledger whose Reserve refuses new reservations while the free space on the
// store's filesystem is below a reserve, so that badger never runs out of space in a
// flush (it faults on a full disk) and calls already in flight can still commit: Commit,
// Renew, Resolve, AppendEvidence, GC and the reads are never refused for space. It is
// safe for concurrent use and forwards Watch.
type Guarded struct {
	*Ledger
	dir     string
	minFree uint64
	free    FreeSpace
}

var (
	_ ledger.Ledger  = (*Guarded)(nil)
	_ ledger.Watcher = (*Guarded)(nil)
)

// GuardSpace returns l (opened on dir) refusing new reservations while free(dir) reports
// less than minFree bytes. free defaults to DiskFree; minFree 0 means DefaultMinFree.
func GuardSpace(l *Ledger, dir string, minFree uint64, free FreeSpace) *Guarded {
	if free == nil {
		free = DiskFree
	}
	if minFree == 0 {
		minFree = DefaultMinFree
	}
	return &Guarded{Ledger: l, dir: dir, minFree: minFree, free: free}
}

// Reserve checks the free space, then reserves as Ledger.Reserve does. Below the reserve
// it returns an error wrapping ErrLowSpace; when the free space cannot be read, the error
// of reading it (fail closed).
func (g *Guarded) Reserve(ctx context.Context, p ledger.ReserveParams) (*ledger.ReserveResult, error) {
	avail, err := g.free(g.dir)
	if err != nil {
		return nil, fmt.Errorf("badger: reading the free space of %s: %w", g.dir, err)
	}
	if avail < g.minFree {
		return nil, fmt.Errorf("%w (%d MiB free on %s, the reserve is %d MiB)", ErrLowSpace, avail>>20, g.dir, g.minFree>>20)
	}
	return g.Ledger.Reserve(ctx, p)
}
