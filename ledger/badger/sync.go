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

// Durability: nothing is acknowledged before it is on stable storage.
//
// What badger v4.9.6 does, read in its source (module cache):
//
//   - A committed txn has been written to the active memtable's write-ahead log (a file
//     "NNNNN.mem", a sparse file of 2 × MemTableSize written through a shared mmap) and, for
//     values of ValueThreshold bytes or more, to the value log "NNNNNN.vlog" (a shared mmap
//     of 2 × ValueLogFileSize, 2 GiB by default): db.go:(*DB).writeRequests → vlog.write
//     (value.go: an entry goes to the value log unless structs.go:skipVlogAndSetThreshold,
//     len(value) < threshold; the threshold is static unless VLogPercentile > 0, which we
//     never set), then writeToLSM → memTable.Put. Only then does txn.go:commitAndSend's
//     callback call orc.doneCommit, which makes the commit visible to new transactions.
//   - db.go:(*DB).Sync msyncs the whole mapping of the active memtable's WAL
//     (memtable.go:SyncWAL → ristretto z/file.go:(*MmapFile).Sync → msync MS_SYNC) and the
//     whole mapping of the current value-log file (value.go:(*valueLog).sync), whether or
//     not anything was written there. Measured on this VM's ext4 (2026-11-29, loaded
//     machine, so ranges): msync of a clean 2 GiB mapping 0.30–0.37 ms, fdatasync of a
//     clean file 0.35–0.38 ms (ext4 still flushes the device cache), a 4 KiB overwrite plus
//     fdatasync 0.5–0.7 ms. So the cost does not scale with the mapping size (shrinking
//     MemTableSize or ValueLogFileSize would not help), but DB.Sync pays a device flush on
//     every round for a value log the ledger almost never writes.
//   - Linux msync(MS_SYNC) on a shared file mapping is vfs_fsync_range(file, start, end,
//     datasync=1) for the mapped range (mm/msync.c, which also notes "The application may
//     now run fsync() to write out the dirty pages": dirty pages of shared mappings are
//     tracked in the page cache of the file, which every descriptor of the file shares).
//     fdatasync(fd) is vfs_fsync_range(file, 0, LLONG_MAX, datasync=1) (fs/sync.c: do_fsync
//     → vfs_fsync): the same call over the whole file, through the same inode's page cache.
//     So fdatasync on our own descriptor of the WAL file makes durable everything badger's
//     msync of it would, and a little more (the range is the whole file). fdatasync also
//     writes "metadata ... needed in order to allow a subsequent data retrieval" (fsync(2)):
//     the block allocations of the sparse file, and a size change (badger never resizes a
//     WAL while writing it: memtable.go:isFull rotates at MemTableSize, half the file).
//   - Memtable rotation does NOT sync the old WAL: db.go:(*DB).ensureRoomForWrite pushes
//     the full memtable to flushChan and opens a new one without syncing, and the old WAL
//     stays the only copy until the flush has written an L0 table (table/table.go:CreateTable
//     msyncs it) and deleted the WAL. Value-log rotation (value.go:(*valueLog).write →
//     toDisk → logFile.doneWriting) syncs the old file only under SyncWrites, and happens
//     only inside vlog.write when entries were written to the value log (woffset and
//     numEntriesWritten grow only then; Open always starts a fresh value-log file).
//   - File ids are consecutive: memtable.go:newMemTable creates nextMemFid and increments
//     it; value.go:createVlogFile creates maxFid+1. Names are "%05d.mem" (mtFilePath) and
//     "%06d.vlog" (vlogFilePath).
//   - New WAL and value-log files are created without syncing their directory:
//     z/file.go:OpenMmapFileUsing calls SyncDir only when the file size is 0, but a new file
//     has already been truncated to its full size by then. Until the directory is synced, a
//     power loss may drop the whole new file.
//   - With SyncWrites, db.go:(*DB).writeToLSM msyncs the WAL after every request, that is
//     once per committed txn, before any later rotation, and value.go:(*valueLog).write
//     msyncs the value log once per batch and on rotation. badger's writer goroutine
//     (db.go:(*DB).doWrites) batches concurrent commits, but the per-txn WAL msync means
//     they do not share a sync: that is why GroupCommit is faster under concurrency.
//
// So a sync round (logSyncer.sync, GroupCommit mode) does not call DB.Sync. It:
//
//  1. Notes the newest commit timestamp whose write has been applied (a read transaction's
//     ReadTs: orc.readTs waits until every commit up to it is done, so each of them is in
//     the WAL, and in the value log where it has a big value, before the round syncs).
//  2. Detects rotations without listing the directory every round (os.ReadDir measured
//     ~50 µs here under load, a stat ~15 µs): it stats the name of the next WAL file (and
//     of the next value-log file when a big value was written, since the value log rotates
//     only then), which is where badger's next file must appear since ids are consecutive.
//     A commit covered by this round returned before the round started, so any file
//     holding it already existed when the round stats the name.
//     Only when the next name exists (or at the first round) does it list the directory:
//     every WAL or value-log file that is not the newest of its kind and has not been
//     fsynced since it was sealed is fsynced once (a vanished one was flushed to an msynced
//     L0 table and deleted, which is fine), the directory is fsynced when any entry
//     appeared since the last listing, and the newest file of each kind is opened, kept
//     open and, when it is new to the listing, fsynced once before the directory: badger
//     creates a log file at its full size (ftruncate) and a directory sync makes only the
//     entry durable, so without this a power loss could leave a synced entry of an empty
//     file, and badger refuses to open a store with an empty value-log or WAL file ("Create
//     a new file"). The value log is otherwise synced only after big values (step 4).
//  3. fdatasyncs the newest WAL through the descriptor it keeps open (by the msync point
//     above, this writes back every page badger's msync of the WAL would).
//  4. fdatasyncs the newest value-log file only when a value of ValueThreshold bytes or
//     more was committed since the previous round. Every value the ledger writes goes
//     through tx.set, which notes a big value; update counts the commit as marked before
//     it commits and as done after, and a round that synced the value log only stops
//     doing so once every marked commit was done before a round started (vlogMarked). The threshold
//     is badger's maximum, 1 MiB; a residual crosses it only with a near-cap result plus
//     large evidence, and then that round also syncs the value log.
//  5. On success, records the timestamp of step 1 as durable (Ledger.durable).
//
// In SyncWrites mode badger already synced each commit's WAL and value-log writes; the round
// does steps 1, 2 and 5 only (directory entries and sealed files). Off Linux (syncOwnLogs
// false, sync_other.go) a GroupCommit round calls DB.Sync instead of steps 3 and 4.
//
// Reads: a step that answers from what it read, without writing, waits until what it read
// is durable (Ledger.awaitDurable): a version above the durable timestamp may belong to a
// commit whose sync has not finished (badger makes a commit visible before our round
// syncs it), so the reader runs a round of its own before answering. A step that writes
// needs no such wait: what it read was in the WAL before its own commit, which its round
// covers. The replay cache holds only residuals read this way, so it never serves a
// record that could vanish in a crash.
//
// The store's own directory entry: badger creates a missing store directory without
// syncing its parent, so a power loss could drop the whole store after commits were
// acknowledged in it. Open creates the directory itself (createDir) and fsyncs the parent
// of every directory it created, and the parent of the store directory on every Open (a
// process that crashed after creating it may not have synced it).
//
// Empty log files: badger refuses to open a store with an empty WAL or value-log file
// (z.OpenMmapFile truncates it to full size and reports it as new, which Open takes for an
// error). A power cut can leave one in two ways: badger creates a WAL and then syncs the
// directory (Open: newMemTable, then newLevelsController's syncDir) before the first round
// syncs the file's size; and badger deletes a flushed WAL by truncating it to 0 and then
// removing it, so a round that fsyncs it as a sealed file in between makes the empty size
// durable while the removal is not yet. An empty log file holds nothing: every WAL or
// value log that held an acknowledged write was synced with its full size. So Open, on
// Linux, deletes them first (removeEmptyLogs), under badger's directory lock. Found by the
// power-loss runs of internal/jepsen (docs/reliability.md).
//
// Not covered here (badger's own business, same in both modes): the L0 table written by a
// memtable flush gets its directory entry synced only by the next compaction or Close.

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
