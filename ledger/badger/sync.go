package badger

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Durability: nothing is acknowledged before it is on stable storage. badger's own DB.Sync
// msyncs the active WAL and value log but leaves out what a power cut can still lose: a
// rotated WAL that was never synced, the directory entries of new log files and of the
// store itself, and a log file whose size was never synced. So in GroupCommit mode a sync
// round (logSyncer.sync) replaces DB.Sync on Linux: it notes the newest applied commit,
// fsyncs every sealed log file not yet synced and every new one with its directory,
// fdatasyncs the newest WAL through a descriptor it keeps open (which covers what badger's
// msync would), syncs the value log only when a big value was written, and only then marks
// the noted commit durable. A read answers only from what is durable (Ledger.awaitDurable),
// and Open removes the empty log files a cut can leave. docs/badger-durability.md gives the
// reasoning step by step, from badger's source.

// groupSync makes committed writes durable with as few sync rounds as possible. A step
// whose commit returned takes a sequence number (committed) and waits (wait) until a round
// that started after that number was taken has finished. One waiter at a time leads a
// round: it snapshots the highest sequence taken, runs sync and wakes every waiter at or
// below the snapshot; the others wait on the condition. A failed round poisons groupSync:
// that round's waiters and every later call get an error wrapping ErrSyncFailed.
type groupSync struct {
	sync func() error
	// batch, when set, is told how many commits each successful round made durable.
	batch func(n uint64)

	mu      sync.Mutex
	cond    sync.Cond
	taken   uint64 // highest sequence handed out: commits up to it have returned
	durable uint64 // every commit up to this sequence is synced
	running bool   // a round is in progress
	err     error  // set once a round failed
	rounds  uint64 // completed rounds, for tests
}

func newGroupSync(syncFn func() error) *groupSync {
	g := &groupSync{sync: syncFn}
	g.cond.L = &g.mu
	return g
}

// committed returns the sequence number of a commit that has just returned (or of a read
// that has just seen committed data and needs a round that starts after it).
func (g *groupSync) committed() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.taken++
	return g.taken
}

// wait returns nil once a sync round that started after seq was taken has succeeded, or an
// error wrapping ErrSyncFailed when a round failed.
func (g *groupSync) wait(seq uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		switch {
		case g.err != nil:
			return g.err
		case g.durable >= seq:
			return nil
		case g.running:
			g.cond.Wait()
			continue
		}
		// Lead a round. Every sequence up to target belongs to a commit that returned
		// before this point, so a sync starting now covers it.
		g.running = true
		target := g.taken
		g.mu.Unlock()
		err := g.sync()
		g.mu.Lock()
		g.running = false
		g.rounds++
		if err != nil {
			g.err = fmt.Errorf("%w: %w", ErrSyncFailed, err)
		} else {
			if g.batch != nil && target > g.durable {
				g.batch(target - g.durable)
			}
			g.durable = max(g.durable, target)
		}
		g.cond.Broadcast()
	}
}

// poisoned returns the error of a failed round, or nil.
func (g *groupSync) poisoned() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Log file kinds badger appends to through mmap, and how it names them.
const (
	walExt  = ".mem"
	vlogExt = ".vlog"
)

var logNameFormat = map[string]string{walExt: "%05d" + walExt, vlogExt: "%06d" + vlogExt}

// openLog is the newest log file of one kind, kept open for syncing.
type openLog struct {
	id   int64
	name string
	f    *os.File
}

// logSyncer makes badger's log files durable in each sync round; see the comment at the
// top of this file. sync and close are called by one goroutine at a time (groupSync runs
// one round at a time; Close runs when no step is in flight); markValueLog by any.
type logSyncer struct {
	dir string
	// syncActive: fdatasync the newest WAL each round, and the newest value-log file when
	// marked (GroupCommit). Off under SyncWrites, where badger synced them already.
	syncActive bool
	// vlogMarked counts commits that may put a value in the value log, raised before each
	// such commit; vlogDone counts the same commits once their Commit returned. A round
	// syncs the value log while vlogMarked exceeds vlogCovered, the vlogDone it read at the
	// start of the last round that synced it: a commit marked but not done when a round
	// synced may write after that sync, so it keeps the value log due until a later round.
	vlogMarked, vlogDone atomic.Uint64
	vlogCovered          uint64

	listed bool                // the directory has been listed at least once
	seen   map[string]bool     // directory entries at the last listing
	sealed map[string]bool     // sealed log files fsynced since they were sealed
	newest map[string]*openLog // extension → newest file of that kind
	// fsync syncs f: its data only (fdatasync) when dataOnly, else data and metadata.
	// Tests replace it to observe or fail syncs.
	fsync func(f *os.File, dataOnly bool) error

	// Counters, for tests.
	listings, sealedSyncs, newSyncs, dirSyncs, walSyncs, vlogSyncs int
}

func newLogSyncer(dir string, syncActive bool) *logSyncer {
	return &logSyncer{
		dir: dir, syncActive: syncActive,
		seen: map[string]bool{}, sealed: map[string]bool{}, newest: map[string]*openLog{},
		fsync: syncFile,
	}
}

// syncFile is fdatasync(2) when dataOnly, fsync(2) otherwise.
func syncFile(f *os.File, dataOnly bool) error {
	if dataOnly {
		return fdatasync(f)
	}
	return f.Sync()
}

// markValueLog records that a commit with a value of ValueThreshold bytes or more is
// about to happen; doneValueLog, called once for each markValueLog, that its Commit
// returned. Rounds sync the value log from the mark until a round that started after the
// done (see vlogMarked).
func (s *logSyncer) markValueLog() { s.vlogMarked.Add(1) }
func (s *logSyncer) doneValueLog() { s.vlogDone.Add(1) }

// sync runs the file part of one round: steps 2 to 4 of the comment at the top.
func (s *logSyncer) sync() error {
	done := s.vlogDone.Load() // before reading the marks: never more than were marked
	valueLog := s.vlogMarked.Load() > s.vlogCovered
	// The directory is listed every round: checking only for the file after the newest
	// known one misses a double rotation (the next WAL created, flushed and deleted while
	// the one after it took the writes), and a listing costs far less than the fdatasync.
	if err := s.list(); err != nil {
		return err
	}
	if !s.syncActive {
		return nil
	}
	kinds := []string{walExt}
	if valueLog {
		kinds = append(kinds, vlogExt)
	}
	for _, ext := range kinds {
		lf := s.newest[ext]
		if lf == nil {
			return fmt.Errorf("no %s file in %s to sync", ext, s.dir)
		}
		if ext == walExt && plant == plantSkipWALSync && s.walSyncs%2 == 1 {
			s.walSyncs++ // planted: this round acknowledges without syncing the WAL
			continue
		}
		if err := s.fsync(lf.f, true); err != nil {
			return fmt.Errorf("sync %s: %w", lf.name, err)
		}
		if ext == walExt {
			s.walSyncs++
		} else {
			s.vlogSyncs++
			s.vlogCovered = done
		}
	}
	return nil
}

// list reads the directory: it fsyncs every sealed log file not yet synced since it was
// sealed, keeps the newest file of each kind open, and fsyncs the directory when an entry
// appeared since the last listing.
func (s *logSyncer) list() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("read dir %s: %w", s.dir, err)
	}
	s.listings++
	type logFile struct {
		name, ext string
		id        int64
	}
	var logs []logFile
	newestID := map[string]int64{}
	present := make(map[string]bool, len(entries))
	appeared := false
	for _, e := range entries {
		name := e.Name()
		present[name] = true
		if !s.seen[name] {
			appeared = true
		}
		for _, ext := range []string{walExt, vlogExt} {
			base, ok := strings.CutSuffix(name, ext)
			if !ok {
				continue
			}
			id, err := strconv.ParseInt(base, 10, 64)
			if err != nil {
				continue
			}
			logs = append(logs, logFile{name, ext, id})
			if cur, ok := newestID[ext]; !ok || id > cur {
				newestID[ext] = id
			}
		}
	}
	// Sealed files first: a file that was the newest at the last listing is synced through
	// the descriptor still open for it, the others by name.
	for _, lf := range logs {
		if lf.id == newestID[lf.ext] || s.sealed[lf.name] {
			continue
		}
		if err := s.syncSealed(lf.name, lf.ext); err != nil {
			return err
		}
		s.sealed[lf.name] = true
		s.sealedSyncs++
	}
	for _, ext := range []string{walExt, vlogExt} {
		id, ok := newestID[ext]
		if !ok {
			continue
		}
		if cur := s.newest[ext]; cur != nil && cur.id == id {
			continue
		}
		name := fmt.Sprintf(logNameFormat[ext], id)
		f, err := os.Open(filepath.Join(s.dir, name))
		if err != nil {
			return fmt.Errorf("open %s: %w", name, err)
		}
		if err := s.fsync(f, false); err != nil {
			_ = f.Close()
			return fmt.Errorf("sync new %s: %w", name, err)
		}
		s.newSyncs++
		if old := s.newest[ext]; old != nil {
			_ = old.f.Close() // synced above as a sealed file, or vanished
		}
		s.newest[ext] = &openLog{id: id, name: name, f: f}
	}
	if appeared {
		if err := s.syncPath(s.dir, false); err != nil {
			return fmt.Errorf("sync dir %s: %w", s.dir, err)
		}
		s.dirSyncs++
	}
	s.seen = present
	for name := range s.sealed {
		if !present[name] {
			delete(s.sealed, name)
		}
	}
	s.listed = true
	return nil
}

// plant names a bug planted for the power-loss test (power_test.go); TestMain sets it in
// that test's worker processes only, from PlantEnv.
var plant string

// plantSkipWALSync is the planted bug: every other round skips the fdatasync of the newest
// WAL, so the commits it acknowledges are durable only once a later round syncs.
const plantSkipWALSync = "skip-wal-sync"

// syncSealed fsyncs a sealed log file. One that vanished was flushed to an msynced L0 table
// (WAL) and deleted, which is fine.
func (s *logSyncer) syncSealed(name, ext string) error {
	if cur := s.newest[ext]; cur != nil && cur.name == name {
		if err := s.fsync(cur.f, false); err != nil {
			return fmt.Errorf("sync sealed %s: %w", name, err)
		}
		return nil
	}
	err := s.syncPath(filepath.Join(s.dir, name), false)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("sync sealed %s: %w", name, err)
	}
	return nil
}

// syncPath opens path (a file or a directory) and syncs it.
func (s *logSyncer) syncPath(path string, dataOnly bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = s.fsync(f, dataOnly)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// close closes the descriptors kept open.
func (s *logSyncer) close() {
	for ext, lf := range s.newest {
		_ = lf.f.Close()
		delete(s.newest, ext)
	}
}

// createDir creates dir and its missing parents (mode 0700, as badger would) and fsyncs
// the parent of each directory it created, and dir's parent in any case, so that the
// store's directory entry is durable before anything is committed in it.
func createDir(dir string) error {
	dir = filepath.Clean(dir)
	var created []string
	for d := dir; ; d = filepath.Dir(d) {
		_, err := os.Stat(d)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		created = append(created, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	parents := []string{filepath.Dir(dir)}
	for _, d := range created[min(1, len(created)):] {
		parents = append(parents, filepath.Dir(d)) // deepest first: dir's own parent is first
	}
	for _, p := range parents {
		if err := syncDirPath(p); err != nil {
			return fmt.Errorf("sync dir %s: %w", p, err)
		}
	}
	return nil
}

// syncDirPath fsyncs the directory at path.
func syncDirPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
