// Package ledger defines the Ledger interface: the durable store of leases and residuals,
// where every method is one atomic, durable step of the ordering barrier.
//
// It imports residual and lease only. Backends live in ledger/badger and ledger/postgres;
// ledger/ledgertest is the conformance suite every backend passes.
package ledger
