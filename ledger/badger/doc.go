// Package badger is the embedded ledger: residuals and fencing-token counters in a local
// badger v4 store, where every ledger step is one transaction acknowledged only after fsync.
//
// It imports ledger, ledger/rules, residual, lease and badger v4; nothing of ours imports it but the wiring
// (the CLI, examples and tests). Only one process may open a store at a time (ErrLocked).
package badger
