// Package jepsen proves the ledgers under faults: a workload of clients in several processes,
// a nemesis, recorded histories checked for linearizability (porcupine) and the fencing invariants.
//
// It imports ledger, its backends, residual, lease and internal/faultproxy; nothing imports it but cmd/toolfence.
package jepsen
