//go:build unix

package badger

import (
	"fmt"
	"os"
	"syscall"
)

// checkPrivateDir returns an error wrapping ErrUnsafeDir unless dir is a directory owned
// by this process's effective user and not writable by group or others (as ssh checks
// ~/.ssh and PostgreSQL its data directory). A symlink to it must be this user's or root's.
func checkPrivateDir(dir string) error {
	euid := uint32(os.Geteuid())
	li, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("badger: store directory %s: %w", dir, err)
	}
	if li.Mode()&os.ModeSymlink != 0 {
		if uid := li.Sys().(*syscall.Stat_t).Uid; uid != euid && uid != 0 {
			return &unsafeDirError{dir: dir, msg: "is a symlink owned by " + userName(uid) + ", not by you (" + userName(euid) + ")",
				hint: "name the directory itself, or a directory of your own"}
		}
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("badger: store directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("badger: store directory %s is not a directory", dir)
	}
	uid := fi.Sys().(*syscall.Stat_t).Uid
	if uid != euid {
		return &unsafeDirError{dir: dir, msg: fmt.Sprintf("is owned by %s with mode %04o, not by you (%s)", userName(uid), fi.Mode().Perm(), userName(euid)),
			hint: fmt.Sprintf("use a new directory of your own (toolfence creates it with mode 0700), or, if this one is yours, chown %d %s && chmod 0700 %s", euid, dir, dir)}
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return &unsafeDirError{dir: dir, msg: fmt.Sprintf("has mode %04o: group or other users can write it", perm),
			hint: "chmod 0700 " + dir}
	}
	return nil
}
