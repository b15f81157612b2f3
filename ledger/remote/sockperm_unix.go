//go:build unix

package remote

import (
	"fmt"
	"os"
	"syscall"
)

// checkSocketFile returns an *untrustedError unless path is a unix socket owned by this
// process's effective user and not writable by group or others. A missing path is the
// Lstat error.
func checkSocketFile(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	euid := uint32(os.Geteuid())
	st := fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.Mode().Type() != os.ModeSocket:
		return &untrustedError{path: path, why: fmt.Sprintf("is not a socket (mode %v)", fi.Mode())}
	case st.Uid != euid:
		return &untrustedError{path: path, why: fmt.Sprintf("is owned by %s, not by you (%s)", userName(st.Uid), userName(euid))}
	case fi.Mode().Perm()&0o022 != 0:
		return &untrustedError{path: path, why: fmt.Sprintf("has mode %04o: group or other users can write it", fi.Mode().Perm())}
	}
	return nil
}
