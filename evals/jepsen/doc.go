// Package jepsen checks the ledgers under faults: clients in several processes, a nemesis, and histories checked for linearizability (porcupine) and the fencing invariants.
// It imports ledger, ledger/badger, ledger/postgres, residual, lease, evals/faultproxy, evals/lazyfs and internal/fixture/pgcluster; only cmd/toolfence (and tests) import it.
package jepsen
