package testkit

import "testing"

// SkipShort skips the test under `go test -short` (make check), saying why: it needs a
// service (PostgreSQL, NATS, node and npm, FUSE, a throwaway cluster) or runs long. Without
// -short the test runs, and with CI=true it fails when the service is missing (make test).
func SkipShort(tb testing.TB, why string) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("-short: " + why)
	}
}
