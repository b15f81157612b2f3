// Package lease holds time-bounded exclusive rights with fencing tokens, the injectable
// clock, safety-margin checks and the keep-alive that renews a lease during a long call.
//
// It imports only residual (for sentinel errors); ledgers and the interceptor build on it.
package lease
