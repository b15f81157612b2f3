// Package demo is the self-contained story of `toolfence demo`: a fake payment API, a
// langchaingo agent killed after its guarded charge reached the API, and a successor agent
// that reconciles through the probe and replays.
//
// It imports interceptor, ledger, ledger/badger, ledger/postgres, residual, tools, httpguard
// and examples/scripted; only cmd/toolfence imports it.
package demo
