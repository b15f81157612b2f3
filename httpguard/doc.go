// Package httpguard is net/http middleware that guards mutating endpoints with the
// Idempotency-Key header (draft-ietf-httpapi-idempotency-key-header) over an interceptor.
//
// It imports interceptor, ledger (the access errors) and residual; nothing of ours imports
// it but the wiring.
package httpguard
