package lazyfs

import (
	"context"
	"maps"
	"os"
	"slices"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// fnode is the go-fuse side of a node: every operation takes FS.mu and works on the model.
// Handles are not used (a file's operations act on the node, whatever descriptor they came
// through), so open and release keep no state.
type fnode struct {
	fs.Inode
	fs *FS
	n  *node
}

var (
	_ fs.NodeLookuper  = (*fnode)(nil)
	_ fs.NodeGetattrer = (*fnode)(nil)
	_ fs.NodeSetattrer = (*fnode)(nil)
	_ fs.NodeOpener    = (*fnode)(nil)
	_ fs.NodeCreater   = (*fnode)(nil)
	_ fs.NodeReader    = (*fnode)(nil)
	_ fs.NodeWriter    = (*fnode)(nil)
	_ fs.NodeFsyncer   = (*fnode)(nil)
	_ fs.NodeMkdirer   = (*fnode)(nil)
	_ fs.NodeUnlinker  = (*fnode)(nil)
	_ fs.NodeRmdirer   = (*fnode)(nil)
	_ fs.NodeRenamer   = (*fnode)(nil)
	_ fs.NodeReaddirer = (*fnode)(nil)
	_ fs.NodeStatfser  = (*fnode)(nil)
)

func (d *fnode) lock() func() {
	d.fs.mu.Lock()
	return d.fs.mu.Unlock
}

// attr fills out from n.
func attr(n *node, out *fuse.Attr) {
	out.Ino, out.Mode = n.id, n.mode
	out.Nlink = 1
	if n.isDir() {
		out.Nlink = 2
	} else {
		out.Size = uint64(n.size)
		out.Blocks = (out.Size + 511) / 512
	}
	out.Blksize = pageSize
	out.Owner = fuse.Owner{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}
	out.SetTimes(nil, &n.mtime, &n.mtime)
}

func (d *fnode) child(ctx context.Context, n *node, out *fuse.EntryOut) *fs.Inode {
	attr(n, &out.Attr)
	return d.NewInode(ctx, &fnode{fs: d.fs, n: n}, fs.StableAttr{Mode: n.mode & syscall.S_IFMT, Ino: n.id})
}

func (d *fnode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	defer d.lock()()
	k, ok := d.n.kids[name]
	if !ok {
		return nil, syscall.ENOENT
	}
	return d.child(ctx, k, out), 0
}

func (d *fnode) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	defer d.lock()()
	attr(d.n, &out.Attr)
	return 0
}

// Setattr changes the size and the mode; owner and time changes are accepted and ignored.
func (d *fnode) Setattr(_ context.Context, _ fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	defer d.lock()()
	if sz, ok := in.GetSize(); ok {
		if d.n.isDir() {
			return syscall.EISDIR
		}
		d.n.truncate(int64(sz))
	}
	if m, ok := in.GetMode(); ok {
		d.n.mode = d.n.mode&syscall.S_IFMT | m&0o7777
	}
	attr(d.n, &out.Attr)
	return 0
}

func (d *fnode) Open(_ context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	defer d.lock()()
	if flags&syscall.O_TRUNC != 0 && !d.n.isDir() {
		d.n.truncate(0)
	}
	return nil, 0, 0
}

func (d *fnode) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	defer d.lock()()
	if k, ok := d.n.kids[name]; ok {
		switch {
		case flags&syscall.O_EXCL != 0:
			return nil, nil, 0, syscall.EEXIST
		case k.isDir():
			return nil, nil, 0, syscall.EISDIR
		case flags&syscall.O_TRUNC != 0:
			k.truncate(0)
		}
		return d.child(ctx, k, out), nil, 0, 0
	}
	k, err := d.fs.newNode(syscall.S_IFREG | mode&0o7777)
	if err != nil {
		return nil, nil, 0, fs.ToErrno(err)
	}
	d.n.kids[name] = k
	return d.child(ctx, k, out), nil, 0, 0
}

func (d *fnode) Read(_ context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	defer d.lock()()
	n, err := d.n.read(dest, off)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (d *fnode) Write(_ context.Context, _ fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	defer d.lock()()
	if err := d.n.write(data, off); err != nil {
		return 0, fs.ToErrno(err)
	}
	return uint32(len(data)), 0
}

// Fsync makes a file's contents, or a directory's entries, durable.
func (d *fnode) Fsync(_ context.Context, _ fs.FileHandle, _ uint32) syscall.Errno {
	defer d.lock()()
	if d.n.isDir() {
		d.n.dkids = maps.Clone(d.n.kids)
		d.fs.counters.DirSyncs++
		return 0
	}
	pages, err := d.n.sync()
	if err != nil {
		return fs.ToErrno(err)
	}
	d.fs.counters.FileSyncs++
	d.fs.counters.SyncedPages += pages
	return 0
}

func (d *fnode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	defer d.lock()()
	if _, ok := d.n.kids[name]; ok {
		return nil, syscall.EEXIST
	}
	k, _ := d.fs.newNode(syscall.S_IFDIR | mode&0o7777) // a directory has no blob: no error
	d.n.kids[name] = k
	return d.child(ctx, k, out), 0
}

func (d *fnode) Unlink(_ context.Context, name string) syscall.Errno {
	defer d.lock()()
	k, ok := d.n.kids[name]
	switch {
	case !ok:
		return syscall.ENOENT
	case k.isDir():
		return syscall.EISDIR
	}
	delete(d.n.kids, name)
	return 0
}

func (d *fnode) Rmdir(_ context.Context, name string) syscall.Errno {
	defer d.lock()()
	k, ok := d.n.kids[name]
	switch {
	case !ok:
		return syscall.ENOENT
	case !k.isDir():
		return syscall.ENOTDIR
	case len(k.kids) > 0:
		return syscall.ENOTEMPTY
	}
	delete(d.n.kids, name)
	return 0
}

// renameNoReplace is RENAME_NOREPLACE of renameat2(2).
const renameNoReplace = 1

// Rename moves a file, replacing a file at the new name unless RENAME_NOREPLACE is given.
// Directories cannot be renamed, nor can RENAME_EXCHANGE be done.
func (d *fnode) Rename(_ context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	defer d.lock()()
	to, ok := newParent.(*fnode)
	if !ok || flags&^renameNoReplace != 0 {
		return syscall.ENOTSUP
	}
	k, ok := d.n.kids[name]
	switch {
	case !ok:
		return syscall.ENOENT
	case k.isDir():
		return syscall.ENOTSUP
	}
	if old, ok := to.n.kids[newName]; ok {
		switch {
		case flags&renameNoReplace != 0:
			return syscall.EEXIST
		case old.isDir():
			return syscall.EISDIR
		}
	}
	delete(d.n.kids, name)
	to.n.kids[newName] = k
	return 0
}

func (d *fnode) Readdir(_ context.Context) (fs.DirStream, syscall.Errno) {
	defer d.lock()()
	var list []fuse.DirEntry
	for _, name := range slices.Sorted(maps.Keys(d.n.kids)) {
		k := d.n.kids[name]
		list = append(list, fuse.DirEntry{Name: name, Ino: k.id, Mode: k.mode & syscall.S_IFMT})
	}
	return fs.NewListDirStream(list), 0
}

// Statfs reports the backing directory's filesystem.
func (d *fnode) Statfs(_ context.Context, out *fuse.StatfsOut) syscall.Errno {
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.fs.backing, &st); err != nil {
		return fs.ToErrno(err)
	}
	out.FromStatfsT(&st)
	return 0
}
