package residual

import "errors"

// Sentinel errors. Callers test for them with errors.Is; richer errors (the ledger's and the
// interceptor's *Violation) wrap them.
var (
	// ErrNotFound: no residual exists for the key in the namespace.
	ErrNotFound = errors.New("residual: not found")
	// ErrInProgress: a live lease holds the key; the call may be in flight.
	ErrInProgress = errors.New("residual: in progress")
	// ErrUnknownOutcome: a prior attempt may have reached upstream and its outcome was never
	// recorded. Reconcile before anything runs again.
	ErrUnknownOutcome = errors.New("residual: unknown outcome")
	// ErrAwaitingUpstream: upstream accepted the call (202 / queued); poll its handle.
	ErrAwaitingUpstream = errors.New("residual: awaiting upstream")
	// ErrPayloadMismatch: the key is already used by a call with different arguments.
	ErrPayloadMismatch = errors.New("residual: payload mismatch")
	// ErrLeaseLost: the caller's lease expired, was preempted or its fencing token is stale;
	// nothing authoritative was written.
	ErrLeaseLost = errors.New("residual: lease lost")
	// ErrMarginTooSmall: too little lease time was left to dispatch or commit safely.
	ErrMarginTooSmall = errors.New("residual: lease margin too small")
	// ErrTokenChanged: a conditional step (ledger.ResolveParams.IfToken) named a fencing
	// token that is no longer the residual's: a later attempt (or resolution) came first.
	// Nothing was written; look at the residual again.
	ErrTokenChanged = errors.New("residual: token changed")
	// ErrInvalidTransition: the state machine does not allow the requested move.
	ErrInvalidTransition = errors.New("residual: invalid transition")
	// ErrInvalidState: a state name that is not one of the five states.
	ErrInvalidState = errors.New("residual: invalid state")
	// ErrInvalidKey: a key that toolfence did not derive (wrong prefix, length or alphabet).
	ErrInvalidKey = errors.New("residual: invalid key")
)
