package lazyfs

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"
)

const pageSize = 4096

// node is a file or a directory. Every field is guarded by FS.mu.
type node struct {
	id    uint64
	mode  uint32 // S_IFREG or S_IFDIR, and the permission bits
	mtime time.Time

	// Files. The volatile contents (what processes read) are, at each offset below size: the
	// dirty page holding it if there is one, else the blob's byte if the offset is below
	// keep, else zero. The durable contents are the blob, dsize bytes long.
	blob  *os.File
	dirty map[int64][]byte // page index → page; bytes at or past size are zero
	size  int64
	dsize int64
	keep  int64 // ≤ size and ≤ dsize: the smallest size since the last sync

	// Directories: the entries as processes see them, and as they were at the last fsync.
	kids, dkids map[string]*node
}

func (n *node) isDir() bool { return n.mode&syscall.S_IFMT == syscall.S_IFDIR }

// readDurable fills buf with the volatile contents at x of a page that is not dirty.
func (n *node) readDurable(buf []byte, x int64) error {
	clear(buf)
	if x >= n.keep {
		return nil
	}
	m := min(int64(len(buf)), n.keep-x)
	if _, err := n.blob.ReadAt(buf[:m], x); err != nil {
		return err // keep ≤ dsize, the blob's size: io.EOF cannot happen here
	}
	return nil
}

// read copies the volatile contents at off into dst and returns how many bytes it copied.
func (n *node) read(dst []byte, off int64) (int, error) {
	if off >= n.size {
		return 0, nil
	}
	end := min(off+int64(len(dst)), n.size)
	for x := off; x < end; {
		p, po := x/pageSize, x%pageSize
		k := min(pageSize-po, end-x)
		buf := dst[x-off : x-off+k]
		if pg, ok := n.dirty[p]; ok {
			copy(buf, pg[po:po+k])
		} else if err := n.readDurable(buf, x); err != nil {
			return 0, err
		}
		x += k
	}
	return int(end - off), nil
}

// write changes the volatile contents only.
func (n *node) write(data []byte, off int64) error {
	for i := int64(0); i < int64(len(data)); {
		x := off + i
		p, po := x/pageSize, x%pageSize
		pg, ok := n.dirty[p]
		if !ok {
			pg = make([]byte, pageSize)
			if err := n.readDurable(pg, p*pageSize); err != nil {
				return err
			}
			n.dirty[p] = pg
		}
		i += int64(copy(pg[po:], data[i:]))
	}
	n.size = max(n.size, off+int64(len(data)))
	n.mtime = time.Now()
	return nil
}

// truncate changes the volatile size only.
func (n *node) truncate(size int64) {
	if size < n.size {
		for p, pg := range n.dirty {
			switch start := p * pageSize; {
			case start >= size:
				delete(n.dirty, p)
			case start+pageSize > size:
				clear(pg[size-start:])
			}
		}
		n.keep = min(n.keep, size)
	}
	n.size = size
	n.mtime = time.Now()
}

// sync makes the volatile contents durable. It returns the number of pages written.
func (n *node) sync() (int, error) {
	if n.keep < n.dsize {
		if err := n.blob.Truncate(n.keep); err != nil {
			return 0, err
		}
	}
	for p, pg := range n.dirty {
		start := p * pageSize
		if _, err := n.blob.WriteAt(pg[:min(pageSize, n.size-start)], start); err != nil {
			return 0, err
		}
	}
	if err := n.blob.Truncate(n.size); err != nil {
		return 0, err
	}
	pages := len(n.dirty)
	clear(n.dirty)
	n.dsize, n.keep = n.size, n.size
	return pages, nil
}

// Counters counts what the FS has done since New.
type Counters struct {
	FileSyncs   int      `json:"file_syncs"`   // fsync and fdatasync calls on files
	DirSyncs    int      `json:"dir_syncs"`    // fsync calls on directories
	SyncedPages int      `json:"synced_pages"` // dirty pages written to blobs by file syncs
	Cuts        int      `json:"cuts"`
	Dropped     CutStats `json:"dropped"` // summed over every cut
}

// CutStats says what one cut dropped.
type CutStats struct {
	// Pages is the number of dirty (unsynced) pages dropped; Files the number of files that
	// had unsynced pages or an unsynced size.
	Pages int `json:"pages"`
	Files int `json:"files"`
	// Entries is the number of directory entries that differed from the directory's last
	// synced state (a name added, removed or pointing elsewhere), in directories that
	// survived the cut.
	Entries int `json:"entries"`
	// Vanished is the number of files that no synced entry reached, deleted with their
	// data: new files whose entry was never synced, and files whose removal was.
	Vanished int `json:"vanished"`
}

func (s CutStats) add(o CutStats) CutStats {
	return CutStats{Pages: s.Pages + o.Pages, Files: s.Files + o.Files, Entries: s.Entries + o.Entries, Vanished: s.Vanished + o.Vanished}
}

func (s CutStats) String() string {
	return fmt.Sprintf("%d unsynced pages in %d files, %d unsynced directory entries, %d files vanished", s.Pages, s.Files, s.Entries, s.Vanished)
}

// newNode makes a node; a file gets an empty blob.
func (f *FS) newNode(mode uint32) (*node, error) {
	f.nextID++
	n := &node{id: f.nextID, mode: mode, mtime: time.Now()}
	if n.isDir() {
		n.kids, n.dkids = map[string]*node{}, map[string]*node{}
		return n, nil
	}
	blob, err := os.OpenFile(f.blobPath(n.id), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	n.blob, n.dirty = blob, map[int64][]byte{}
	f.files[n.id] = n
	return n, nil
}

func (f *FS) blobPath(id uint64) string {
	return filepath.Join(f.backing, strconv.FormatUint(id, 10))
}

// drop resets every node a durable entry reaches to its durable state and deletes the
// rest: the model of a power cut. The FS must not be mounted.
func (f *FS) drop() (CutStats, error) {
	var st CutStats
	reached := map[*node]bool{}
	var walk func(n *node)
	walk = func(n *node) {
		if reached[n] {
			return
		}
		reached[n] = true
		if n.isDir() {
			for name, k := range n.kids {
				if n.dkids[name] != k {
					st.Entries++
				}
			}
			for name := range n.dkids {
				if _, ok := n.kids[name]; !ok {
					st.Entries++
				}
			}
			n.kids = maps.Clone(n.dkids)
			for _, name := range slices.Sorted(maps.Keys(n.dkids)) {
				walk(n.dkids[name])
			}
			return
		}
		if len(n.dirty) > 0 || n.size != n.dsize || n.keep != n.dsize {
			st.Files++
			st.Pages += len(n.dirty)
		}
		clear(n.dirty)
		n.size, n.keep = n.dsize, n.dsize
	}
	walk(f.root)
	var errs []error
	for id, n := range f.files {
		if reached[n] {
			continue
		}
		st.Vanished++
		errs = append(errs, n.blob.Close(), os.Remove(f.blobPath(id)))
		delete(f.files, id)
	}
	return st, errors.Join(errs...)
}
