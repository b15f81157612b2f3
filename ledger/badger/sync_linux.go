//go:build linux

package badger

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

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

// removeEmptyLogs deletes the empty WAL and value-log files of the store in dir (see
// "Empty log files" in sync.go), holding badger's directory lock (an flock of the
// directory) meanwhile. A store in use is left alone: badger's Open reports it as locked.
func removeEmptyLogs(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil
		}
		return &os.PathError{Op: "flock", Path: dir, Err: err}
	}
	// Unlock explicitly: a child forked meanwhile shares d until it execs, and would keep
	// a lock that only Close released from badger's Open right after this.
	defer unix.Flock(int(d.Fd()), unix.LOCK_UN)
	ents, err := d.ReadDir(-1)
	if err != nil {
		return err
	}
	removed := false
	for _, e := range ents {
		name := e.Name()
		base, ok := strings.CutSuffix(name, walExt)
		if !ok {
			base, ok = strings.CutSuffix(name, vlogExt)
		}
		if _, err := strconv.ParseUint(base, 10, 64); !ok || err != nil || !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if fi.Size() != 0 {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			return err
		}
		removed = true
	}
	if removed {
		return d.Sync()
	}
	return nil
}
