//go:build linux

package badger

import (
	"os"

	"golang.org/x/sys/unix"
)

// syncOwnLogs: on Linux a sync round fdatasyncs badger's active WAL (and value log) through
// its own descriptor instead of calling DB.Sync; see the msync point at the top of sync.go.
const syncOwnLogs = true

// fdatasync is fdatasync(2), retried on EINTR.
func fdatasync(f *os.File) error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		switch err {
		case nil:
			return nil
		case unix.EINTR:
			continue
		}
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
	}
}
