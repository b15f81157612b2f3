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
)

// Durability: nothing is acknowledged before it is on stable storage.
//
// What badger v4.9.6 guarantees, read in its source (module cache):
//
//   - A committed txn has been written to the active memtable's write-ahead log (a file
//     "NNNNN.mem" written through a shared mmap) and, for values above ValueThreshold
//     (1 MiB by default, so never for a ledger record), to the value log "NNNNNN.vlog":
//     db.go:(*DB).writeRequests → vlog.write, then writeToLSM → memTable.Put.
//   - db.go:(*DB).Sync msyncs the WAL of the memtable that is active when it runs
//     (memtable.go:(*memTable).SyncWAL → logFile.Sync → ristretto z/file.go:(*MmapFile).Sync
//     → z/mmap_linux.go:msync with MS_SYNC) and the current value-log file
//     (value.go:(*valueLog).sync, a no-op when SyncWrites is on because then every write
//     already synced).
//   - Memtable rotation does NOT sync the old WAL: db.go:(*DB).ensureRoomForWrite pushes
//     the full memtable to flushChan and opens a new one without syncing, and the old WAL
//     stays the only copy until the flush has written an L0 table (table/table.go:CreateTable
//     msyncs it) and deleted the WAL. A commit that landed in the old WAL just before a
//     rotation is not covered by a later DB.Sync. Likewise value-log rotation
//     (value.go:(*valueLog).write → toDisk → logFile.doneWriting) syncs the old file only
//     under SyncWrites.
//   - New WAL and value-log files are created without syncing their directory:
//     z/file.go:OpenMmapFileUsing calls SyncDir only when the file size is 0, but a new file
//     has already been truncated to its full size by then. Until the directory is synced, a
//     power loss may drop the whole new file.
//   - With SyncWrites, db.go:(*DB).writeToLSM msyncs the WAL after every request, that is
//     once per committed txn, before any later rotation (ensureRoomForWrite runs before
//     each request's writeToLSM), and value.go:(*valueLog).write msyncs the value log once
//     per batch and on rotation. badger's writer goroutine (db.go:(*DB).doWrites) batches
//     concurrent commits, but the per-txn WAL msync means they do not share a sync: that is
//     why GroupCommit is faster under concurrency (see bench_test.go).
//
// So a step's sync round, after DB.Sync, also fsyncs every WAL or value-log file that is
// not the newest of its kind (sealed by a rotation) once, and fsyncs the directory whenever
// a file appeared since the last round (fileSyncer.sync). fsync on a file descriptor writes
// the same page-cache pages that badger dirtied through its mmap (Linux has one page cache).
// A sealed file that vanished was flushed to an msynced L0 table and deleted, which is
// fine. In SyncWrites mode the round does only the file and directory part.
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

// committed returns the sequence number of a commit that has just returned.
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

// fileSyncer makes the files badger creates and rotates durable beyond what DB.Sync
// covers; see the comment at the top of this file. It is called by one round at a time.
type fileSyncer struct {
	dir    string
	seen   map[string]bool // files whose directory entry has been synced
	sealed map[string]bool // sealed WAL / value-log files fsynced after they were sealed
	fsync  func(path string) error
	// sealedSyncs and dirSyncs count fsyncs, for tests.
	sealedSyncs, dirSyncs int
}

func newFileSyncer(dir string) *fileSyncer {
	return &fileSyncer{dir: dir, seen: map[string]bool{}, sealed: map[string]bool{}, fsync: fsyncPath}
}

// logExts are the file kinds badger appends to through mmap.
var logExts = []string{".mem", ".vlog"}

// sync fsyncs every sealed log file not yet synced since it was sealed, then the directory
// when a file appeared since the last call.
func (f *fileSyncer) sync() error {
	entries, err := os.ReadDir(f.dir)
	if err != nil {
		return fmt.Errorf("read dir %s: %w", f.dir, err)
	}
	newest := map[string]int64{} // extension → highest file id
	type logFile struct {
		name, ext string
		id        int64
	}
	var logs []logFile
	present := make(map[string]bool, len(entries))
	newFile := false
	for _, e := range entries {
		name := e.Name()
		present[name] = true
		if !f.seen[name] {
			newFile = true
		}
		for _, ext := range logExts {
			base, ok := strings.CutSuffix(name, ext)
			if !ok {
				continue
			}
			id, err := strconv.ParseInt(base, 10, 64)
			if err != nil {
				continue
			}
			logs = append(logs, logFile{name, ext, id})
			if cur, ok := newest[ext]; !ok || id > cur {
				newest[ext] = id
			}
		}
	}
	for _, lf := range logs {
		if lf.id == newest[lf.ext] || f.sealed[lf.name] {
			continue
		}
		err := f.fsync(filepath.Join(f.dir, lf.name))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("sync sealed %s: %w", lf.name, err)
		}
		f.sealed[lf.name] = true
		f.sealedSyncs++
	}
	if newFile {
		if err := f.fsync(f.dir); err != nil {
			return fmt.Errorf("sync dir %s: %w", f.dir, err)
		}
		f.dirSyncs++
	}
	f.seen = present
	for name := range f.sealed {
		if !present[name] {
			delete(f.sealed, name)
		}
	}
	return nil
}

// fsyncPath opens path (a file or a directory) and fsyncs it.
func fsyncPath(path string) error {
	fd, err := os.Open(path)
	if err != nil {
		return err
	}
	err = fd.Sync()
	if cerr := fd.Close(); err == nil {
		err = cerr
	}
	return err
}
