//go:build unix

package npmci

import (
	"os"
	"path/filepath"
	"syscall"
)

// lockFile, in the project's directory, is what concurrent installs of it lock.
const lockFile = ".npmci.lock"

// lockDir takes an exclusive flock on dir's lock file, waiting for another process's
// install of dir to finish, and returns its release.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}
