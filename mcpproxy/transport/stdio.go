package transport

import (
	"errors"
	"io"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"
)

// Stdio returns the connection of a proxy to its host over r (the host's requests, usually
// os.Stdin) and w (the answers, usually os.Stdout): newline-delimited JSON-RPC. It closes
// neither r nor w.
//
// When r or w is a pipe or a socket (*os.File), the connection uses a duplicate of its
// descriptor in non-blocking mode, so that Go reads and writes it through its network
// poller: a blocking read holds a thread in the kernel, and taking the read's answer back
// from it cost a relayed call about a fifth more than through the poller (measured in
// internal/checks/proxybench). Close closes the duplicates, which ends a pending Read, and puts
// the descriptors back in blocking mode. For any other r, a Read pending on r ends only
// when r does (Serve returns without waiting for it).
func Stdio(r io.Reader, w io.Writer) mcp.Connection {
	var dups []*os.File
	var restore []func() error
	if f, ok := r.(*os.File); ok {
		if p, undo := pollable(f); p != nil {
			r, dups, restore = p, append(dups, p), append(restore, undo)
		}
	}
	if f, ok := w.(*os.File); ok {
		if p, undo := pollable(f); p != nil {
			w, dups, restore = p, append(dups, p), append(restore, undo)
		}
	}
	var closer func() error
	if len(dups) > 0 {
		closer = func() error {
			// Every duplicate first: stdin and stdout may be one socket, whose mode must
			// not turn blocking under a write still in progress on the other duplicate.
			var errs []error
			for _, d := range dups {
				errs = append(errs, d.Close())
			}
			for _, undo := range restore {
				errs = append(errs, undo())
			}
			return errors.Join(errs...)
		}
	}
	return newLineConn(r, w, closer)
}

// pollable returns a non-blocking duplicate of f's descriptor, as an *os.File the runtime
// polls, and the function that puts f back in blocking mode (the mode belongs to the open
// file, which the duplicate shares) once the duplicate is closed. It returns nil when f is
// not a pipe or a socket (a terminal or a file keeps its mode: other processes may share
// it), when f is non-blocking already (Go polls it as it is: an *os.File of os.Pipe, or a
// stdin handed over non-blocking), or when the duplicate cannot be made. It reads f's
// descriptor without f.Fd, which would switch f to blocking mode for good.
func pollable(f *os.File) (*os.File, func() error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, nil
	}
	var fd, dup int
	ok := false
	cerr := rc.Control(func(u uintptr) {
		fd = int(u)
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil {
			return
		}
		if t := st.Mode & unix.S_IFMT; t != unix.S_IFIFO && t != unix.S_IFSOCK {
			return
		}
		flags, err := unix.FcntlInt(u, unix.F_GETFL, 0)
		if err != nil || flags&unix.O_NONBLOCK != 0 {
			return
		}
		if dup, err = unix.FcntlInt(u, unix.F_DUPFD_CLOEXEC, 0); err != nil {
			return
		}
		if err := unix.SetNonblock(dup, true); err != nil {
			_ = unix.Close(dup)
			return
		}
		ok = true
	})
	if cerr != nil || !ok {
		return nil, nil
	}
	// The descriptor number stays f's while f is open; Stdio's caller keeps f open (Stdio
	// never closes r or w).
	return os.NewFile(uintptr(dup), f.Name()), func() error { return unix.SetNonblock(fd, false) }
}
