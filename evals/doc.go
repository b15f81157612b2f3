// Package evals is the crash-simulation suite: it kills real worker processes at named
// barriers of a guarded tool call and grades every outcome from an effect sink's own log.
//
// It imports residual, interceptor, ledger with both backends, evals/baselines, and for the
// MCP proxy subjects mcpproxy, examples/payments and the official Go SDK; only cmd/toolfence
// imports it (for `toolfence eval` and its hidden worker, sink, payments and relay commands).
package evals
