package remote

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// maxSockPath is the longest socket path every platform binds (sun_path holds 104 bytes on
// BSDs, 108 on Linux, both with the terminating NUL).
const maxSockPath = 103

// sockAddr returns an address for the unix socket at path that fits in sun_path: path
// itself when short enough; on Linux, for a longer path, the name reached through the
// open directory (/proc/self/fd/N/NAME), valid until release is called.
func sockAddr(path string) (addr string, release func(), err error) {
	if len(path) <= maxSockPath {
		return path, func() {}, nil
	}
	if runtime.GOOS != "linux" {
		return "", nil, fmt.Errorf("socket path %s is %d bytes long, more than a unix socket takes (%d): use a store directory with a shorter path", path, len(path), maxSockPath)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return "", nil, err
	}
	addr = fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path))
	if len(addr) > maxSockPath {
		dir.Close()
		return "", nil, fmt.Errorf("socket name %s is too long for a unix socket", filepath.Base(path))
	}
	return addr, func() { dir.Close() }, nil
}
