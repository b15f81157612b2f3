// Package evals is the crash-simulation suite: it kills real worker processes at named
// barriers of a guarded tool call and grades every outcome from an effect sink's own log.
//
// It imports residual, interceptor, ledger, ledger/badger, ledger/postgres, evals/baselines,
// and for the MCP proxy subjects mcpwire, examples/payments and the official Go SDK (it runs
// the proxy as a process, not as a package); only cmd/toolfence
// imports it (for `toolfence eval` and its hidden worker, sink, payments and relay commands).
package evals
