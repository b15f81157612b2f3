package mcpproxy

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
// internal/proxybench). Close closes the duplicates, which ends a pending Read, and puts
// the descriptors back in blocking mode. For any other r, a Read pending on r ends only
// when r does (Serve returns without waiting for it).
func Stdio(r io.Reader, w io.Writer) mcp.Connection {
	var undo []func() error
	if f, ok := r.(*os.File); ok {
		if p, restore := pollable(f); p != nil {
			r, undo = p, append(undo, restore)
		}
	}
	if f, ok := w.(*os.File); ok {
		if p, restore := pollable(f); p != nil {
			w, undo = p, append(undo, restore)
		}
	}
	var closer func() error
	if len(undo) > 0 {
		closer = func() error {
			var errs []error
			for _, u := range undo {
				errs = append(errs, u())
			}
			return errors.Join(errs...)
		}
	}
	return newLineConn(r, w, closer)
}

// pollable returns a non-blocking duplicate of f's descriptor, as an *os.File the runtime
// polls, and the function that closes it and puts f back in blocking mode (the mode belongs
// to the open file, which the duplicate shares). It returns nil when f is not a pipe or a
// socket (a terminal or a file keeps its blocking mode: other processes may share it), or
// when the duplicate cannot be made.
func pollable(f *os.File) (*os.File, func() error) {
	fd := int(f.Fd())
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return nil, nil
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFIFO && t != unix.S_IFSOCK {
		return nil, nil
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return nil, nil
	}
	wasNonblock := flags&unix.O_NONBLOCK != 0
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, nil
	}
	if err := unix.SetNonblock(dup, true); err != nil {
		_ = unix.Close(dup)
		return nil, nil
	}
	p := os.NewFile(uintptr(dup), f.Name())
	return p, func() error {
		err := p.Close()
		if !wasNonblock {
			err = errors.Join(err, unix.SetNonblock(fd, false))
		}
		return err
	}
}
