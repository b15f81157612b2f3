// Package jepsen checks the ledgers under faults: clients in several processes, a nemesis, and histories checked for linearizability (porcupine) and the fencing invariants.
// It imports ledger, its backends, residual, lease, internal/faultproxy and internal/pgcluster; only cmd/toolfence imports it.
package jepsen
