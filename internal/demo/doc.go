// Package demo is the self-contained story of `toolfence demo`: a fake payment API, a worker
// killed after its charge reached the API, and a successor that reconciles and replays.
//
// It imports interceptor, ledger, ledger/badger and residual; only cmd/toolfence imports it.
package demo
