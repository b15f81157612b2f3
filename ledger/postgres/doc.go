// Package postgres is the PostgreSQL ledger (pgx v5): many agents on many machines share one
// fenced ledger, with expiry decided by the database server's clock.
//
// It imports residual, lease, ledger and ledger/rules, whose Decide and Apply* rules it applies
// so it agrees with every other backend; its schema comes from embedded, versioned migrations.
//
// Storage: one row per (namespace, key) in toolfence_residuals, whose primary key is the
// final safety net against a second reservation. The row carries the key's fencing token,
// so a reservation writes one row of one table. GC never deletes a row: it turns a settled
// residual into a tombstone (state 'collected') that keeps only the key and its last token,
// which no read returns, so a key reserved again after GC gets a higher token than any it
// had. Reserve and Commit are one statement each on the fast path; concurrent ones of one
// Ledger share that statement, so many callers pay for one transaction and one WAL flush.
package postgres
