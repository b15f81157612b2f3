package badger

import (
	"errors"
	"fmt"

	dbadger "github.com/dgraph-io/badger/v4"
)

// ErrLowSpace is wrapped by the error of a write refused because the store's filesystem is
// low on free space (nothing of it was written; a refused Reserve dispatches nothing), and
// by Open's error when the filesystem has too little space to open the store safely.
var ErrLowSpace = errors.New("badger: the store's filesystem is low on free space")

// DefaultMinFree is the default of Options.MinFree: the free space below which new
// reservations are refused.
const DefaultMinFree = 256 << 20

// LeastMinFree is the smallest Options.MinFree Open takes with the default memtables:
// twice the floor where every write stops.
const LeastMinFree = 2 * (3*defaultMemTableSize + 4*valueThreshold + 4<<20)

// FreeSpace returns the bytes available on the filesystem that holds dir.
type FreeSpace func(dir string) (uint64, error)

// badger maps its write-ahead logs, value logs and new tables into memory over files it
// sizes up front (sparse), so a write into them on a full filesystem is a SIGBUS, not an
// error, and the store cannot be opened again until space is freed: every write must stop
// while there is still room for what badger writes on its own (flushes, compactions).
//
// The guard has three levels, checked before each write commits:
//   - below MinFree, new reservations are refused (nothing is dispatched);
//   - below MinFree/2, the other writes that grow the store are refused too: resolutions
//     and appended evidence (their notes and results can be large);
//   - below the floor, commits, renewals and gc are refused as well, so calls already in
//     flight keep the room between MinFree/2 and the floor to record their outcome.
//
// The floor is what badger may write without asking: the memtable being filled (its log is
// sized to twice the memtable), one flushed memtable as a table, and a few large values.

// spaceFloor returns the floor for badger options bo (LeastMinFree/2 for the defaults).
func spaceFloor(bo dbadger.Options) uint64 {
	return uint64(3*bo.MemTableSize + 4*bo.ValueThreshold + 4<<20)
}

// spaceGuard checks the free space before each write.
type spaceGuard struct {
	dir     string
	free    FreeSpace
	minFree uint64
	floor   uint64
}

// level returns the free space op must leave, and what is refused at that level.
func (g *spaceGuard) level(op string) (uint64, string) {
	switch op {
	case "reserve":
		return g.minFree, "new reservations are refused (nothing was dispatched)"
	case "resolve", "append evidence":
		return g.minFree / 2, "resolutions and evidence are refused, commits of calls in flight still land"
	default:
		return g.floor, "every write is refused to keep the store openable"
	}
}

// check returns an error wrapping ErrLowSpace when writing n more bytes for op would leave
// less free space than op's level; when the free space cannot be read, that error (fail
// closed).
func (g *spaceGuard) check(op string, n int) error {
	avail, err := g.free(g.dir)
	if err != nil {
		return fmt.Errorf("badger: %s: reading the free space of %s: %w", op, g.dir, err)
	}
	need, what := g.level(op)
	if avail < need+uint64(n) {
		return fmt.Errorf("badger: %s: %w: %d MiB free on %s, below the %d MiB kept at this level: %s; free space on that filesystem (gc settled residuals, move other files away)",
			op, ErrLowSpace, avail>>20, g.dir, need>>20, what)
	}
	return nil
}

// checkOpen returns an error wrapping ErrLowSpace when the filesystem of dir has less than
// the floor free: badger could fault replaying or flushing the store.
func (g *spaceGuard) checkOpen() error {
	avail, err := g.free(g.dir)
	if err != nil {
		return fmt.Errorf("badger: reading the free space of %s: %w", g.dir, err)
	}
	if avail < g.floor {
		return fmt.Errorf("badger: open %s: %w: %d MiB free, the store needs at least %d MiB to open (badger writes its logs and tables into preallocated files); free space on that filesystem and try again",
			g.dir, ErrLowSpace, avail>>20, g.floor>>20)
	}
	return nil
}
