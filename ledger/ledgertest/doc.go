// Package ledgertest is the conformance suite every ledger backend passes: Run drives a
// Harness through every rule of ledger.Ledger, each case on a fresh ledger.
//
// It imports ledger, ledger/rules (for the bounds it checks), residual, lease and testify only. Time-dependent cases never sleep:
// they move the ledger's clock through Fixture.Advance, which an embedded backend implements
// by advancing a lease.Fake and a server-clock backend (PostgreSQL) by shifting the offset
// it adds to the server's time. Fixture.Now reads that same clock, and Harness.TimePrecision
// says how finely the backend stores instants (a nanosecond for badger, a microsecond for
// PostgreSQL). Close-and-reopen persistence is checked only when Fixture.Reopen is set, and
// change streams only when the ledger implements ledger.Watcher.
package ledgertest
