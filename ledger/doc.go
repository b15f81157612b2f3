// Package ledger defines the Ledger interface: the durable store of leases and residuals,
// where every method is one atomic, durable step of the ordering barrier.
//
// It imports residual and lease only; it holds the contract alone. Backends live in
// ledger/badger and ledger/postgres and share the state rules of ledger/rules;
// ledger/remote reaches a ledger served by another process (over HTTP or the unix socket of
// a shared embedded store); ledger/ledgertest is the conformance suite every backend passes.
package ledger
