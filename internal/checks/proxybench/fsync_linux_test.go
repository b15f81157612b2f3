//go:build linux

package proxybench_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// BenchmarkFsyncBackToBack is the disk's floor as GuardedCall meets it: a 4 KiB overwrite
// and fdatasync of one file, one after the other.
func BenchmarkFsyncBackToBack(b *testing.B) { fsyncs(b, 0) }

// BenchmarkFsyncSpaced is the same sync a millisecond after the previous one ended, as the
// syncs of a guarded call are spaced when the tool is an upstream server (the proxy, and
// GuardedUpstreamCall). Its ns/op is the time of the sync alone. With BenchmarkFsyncBackToBack,
// a reference: on a disk whose syncs cost more when they are spaced, a guarded call around
// a real upstream call costs more than GuardedCall's loop (docs/benchmarks.md).
func BenchmarkFsyncSpaced(b *testing.B) { fsyncs(b, time.Millisecond) }

// fsyncs overwrites a 4 KiB block of a file and fdatasyncs it, waiting gap before each
// write, and reports the mean time of the write and sync as ns/op.
func fsyncs(b *testing.B, gap time.Duration) {
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "fsync"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	block := make([]byte, 4096)
	if _, err := f.WriteAt(block, 0); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	var synced time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if gap > 0 {
			time.Sleep(gap)
		}
		start := time.Now()
		block[0] = byte(i)
		if _, err := f.WriteAt(block, 0); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		synced += time.Since(start)
	}
	b.ReportMetric(float64(synced)/float64(b.N), "ns/op")
}
