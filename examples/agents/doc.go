// Package agents holds the runnable agent examples (payments, webhooks, email), each a main
// package that runs offline, and the test that builds and runs them and checks their counts.
//
// Nothing imports it; the examples import toolfence's tools, interceptor and ledger/badger.
package agents
