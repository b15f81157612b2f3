// Package postgres is the PostgreSQL ledger (pgx v5): many agents on many machines share one
// fenced ledger, with expiry decided by the database server's clock.
//
// It imports residual, lease and ledger, and applies ledger's Decide and Apply* rules so it
// agrees with every other backend; its schema comes from embedded, versioned migrations.
package postgres
