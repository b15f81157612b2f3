// Package baselines holds the guards toolfence is measured against in the evals: no guard,
// record-after, check-then-insert middleware, an expiring in-progress record, and
// mark-before (a deduplicator that marks a key done before it runs the call).
//
// It imports only the standard library; evals drives these guards the way it drives toolfence.
package baselines
