//go:build !linux

package badger

import "os"

// syncOwnLogs is false off Linux: there the argument that fsync on our own descriptor
// writes back what badger's msync of its mapping would is not established (Windows, for
// one, needs FlushViewOfFile on the mapping), so GroupCommit rounds call DB.Sync for the
// active WAL and value log and keep only the sealed-file and directory part of logSyncer.
const syncOwnLogs = false

// fdatasync falls back to a full fsync.
func fdatasync(f *os.File) error { return f.Sync() }

// removeEmptyLogs does nothing off Linux: the power-loss tests that found the empty log
// files run on Linux only (see "Empty log files" in sync.go).
func removeEmptyLogs(string) error { return nil }
