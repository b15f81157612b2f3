package lazyfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// FS is a lazy filesystem: see the package documentation. Its methods are safe for
// concurrent use; Mount, Unmount, Cut and Export must not overlap one another.
type FS struct {
	backing string

	mu       sync.Mutex
	root     *node
	nextID   uint64
	files    map[uint64]*node // every file node, by id: its blob is backing/<id>
	counters Counters
	exported bool

	server *fuse.Server
	mnt    string
}

// Available reports why a lazy FS cannot be mounted here (no /dev/fuse, or not root: the
// mount is made with mount(2), or by fusermount3 when that fails), or nil when it can.
func Available() error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("lazyfs: %w", err)
	}
	if os.Geteuid() != 0 {
		return errors.New("lazyfs: not root")
	}
	return nil
}

// New returns an empty lazy FS (its root directory durable) whose durable file contents
// live in backing, which must be empty or not exist.
func New(backing string) (*FS, error) {
	if err := os.MkdirAll(backing, 0o700); err != nil {
		return nil, err
	}
	if ents, err := os.ReadDir(backing); err != nil || len(ents) > 0 {
		return nil, fmt.Errorf("lazyfs: backing directory %s must be empty (%d entries, %v)", backing, len(ents), err)
	}
	f := &FS{backing: backing, files: map[uint64]*node{}}
	f.root, _ = f.newNode(syscall.S_IFDIR | 0o755) // a directory has no blob: no error
	return f, nil
}

// Mount serves the FS at dir (which must exist) until Unmount.
func (f *FS) Mount(dir string) error {
	f.mu.Lock()
	exported := f.exported
	f.mu.Unlock()
	switch {
	case exported:
		return errors.New("lazyfs: exported; the FS cannot be mounted again")
	case f.server != nil:
		return fmt.Errorf("lazyfs: already mounted at %s", f.mnt)
	}
	zero := time.Duration(0)
	srv, err := fs.Mount(dir, &fnode{fs: f, n: f.root}, &fs.Options{
		MountOptions: fuse.MountOptions{FsName: "lazyfs", Name: "lazyfs", DirectMount: true, DisableXAttrs: true},
		// The kernel caches nothing about names: every lookup sees the model.
		EntryTimeout: &zero, NegativeTimeout: &zero,
	})
	if err != nil {
		return fmt.Errorf("lazyfs: mount %s: %w", dir, err)
	}
	f.server, f.mnt = srv, dir
	return nil
}

// Unmount ends the mount and waits for its server to stop. Every process that had files
// open on it must have closed them (or exited) first. A few quick retries cover the
// kernel's release of a just-exited process's files.
func (f *FS) Unmount() error {
	if f.server == nil {
		return nil
	}
	var err error
	for i := range 50 {
		if err = f.server.Unmount(); err == nil {
			break
		}
		time.Sleep(time.Duration(i+1) * 2 * time.Millisecond) // the mount is busy: EBUSY has no event to wait for
	}
	if err != nil {
		return fmt.Errorf("lazyfs: unmount %s: %w", f.mnt, err)
	}
	f.server.Wait()
	f.server, f.mnt = nil, ""
	return nil
}

// Cut is a power cut: it unmounts (the processes using the mount must be dead already),
// drops every change that was not synced, and mounts again at the same place if it was
// mounted. It returns what was dropped.
func (f *FS) Cut() (CutStats, error) {
	mnt := f.mnt
	if err := f.Unmount(); err != nil {
		return CutStats{}, err
	}
	f.mu.Lock()
	st, err := f.drop()
	f.counters.Cuts++
	f.counters.Dropped = f.counters.Dropped.add(st)
	f.mu.Unlock()
	if err != nil {
		return st, fmt.Errorf("lazyfs: cut: %w", err)
	}
	if mnt != "" {
		return st, f.Mount(mnt)
	}
	return st, nil
}

// Counters returns what the FS has done so far.
func (f *FS) Counters() Counters {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counters
}

// Export unmounts and writes the durable tree (what a cut now would leave) into dir, which
// must not exist, as hard links to the blobs: dir must be on the backing directory's
// filesystem. The FS cannot be mounted afterwards (a write would change the links).
func (f *FS) Export(dir string) error {
	if err := f.Unmount(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exported = true
	var export func(n *node, path string) error
	export = func(n *node, path string) error {
		if !n.isDir() {
			return os.Link(f.blobPath(n.id), path)
		}
		if err := os.Mkdir(path, 0o700); err != nil {
			return err
		}
		for name, k := range n.dkids {
			if err := export(k, filepath.Join(path, name)); err != nil {
				return err
			}
		}
		return nil
	}
	return export(f.root, dir)
}

// Close unmounts and closes the blobs; the backing directory stays.
func (f *FS) Close() error {
	err := f.Unmount()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range f.files {
		err = errors.Join(err, n.blob.Close())
	}
	return err
}
