// Package residual defines the durable record a guarded tool call leaves behind: its states,
// the transitions between them, key and digest derivation, and the sentinel errors.
//
// It is pure: no I/O and no imports from the rest of toolfence. Everything else builds on it.
package residual
