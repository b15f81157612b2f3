// Package rules holds the state rules of the ledger steps as pure functions over a residual,
// so every backend enforces exactly the same ones. It imports ledger, residual and lease.
package rules
