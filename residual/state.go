package residual

import "fmt"

// State is the state of a residual. The zero value None means "no residual exists".
type State string

// The residual states of docs/design.md. See Transition for the allowed moves between them.
const (
	// None is the state of a key that has no residual yet.
	None State = ""
	// Pending: reserved under a live lease; the call may be in flight.
	Pending State = "pending"
	// Unknown: the call may have reached upstream but nobody recorded the outcome (the lease
	// of a pending residual expired, or the call ended ambiguously). Blocks until reconciled.
	Unknown State = "unknown"
	// Accepted: upstream answered 202 / queued; the effect is in flight over there.
	// Never a success.
	Accepted State = "accepted"
	// Succeeded: upstream confirmed the effect. New calls replay the cached result.
	Succeeded State = "succeeded"
	// Failed: upstream confirmed no effect, or the call was never dispatched. A new call
	// starts a new attempt.
	Failed State = "failed"
)

// States lists every state a residual can be in, in lifecycle order.
var States = []State{Pending, Unknown, Accepted, Succeeded, Failed}

// Valid reports whether s is one of the five residual states (None is not).
func (s State) Valid() bool {
	switch s {
	case Pending, Unknown, Accepted, Succeeded, Failed:
		return true
	}
	return false
}

// Terminal reports whether s is settled: succeeded or failed.
func (s State) Terminal() bool { return s == Succeeded || s == Failed }

// Open reports whether s needs attention before the key can be used again by a new attempt
// or replayed: pending, unknown or accepted.
func (s State) Open() bool { return s == Pending || s == Unknown || s == Accepted }

// String returns the state name, or "none" for None.
func (s State) String() string {
	if s == None {
		return "none"
	}
	return string(s)
}

// ParseState parses a state name. It returns an error wrapping ErrInvalidState for anything
// but the five state names.
func ParseState(name string) (State, error) {
	s := State(name)
	if !s.Valid() {
		return None, fmt.Errorf("%w: %q (want pending, unknown, accepted, succeeded or failed)", ErrInvalidState, name)
	}
	return s, nil
}

// transitions is the whole table of allowed moves; anything absent is refused.
var transitions = map[State][]State{
	// A reservation creates the first attempt.
	None: {Pending},
	// The holder commits an outcome; an expired lease turns pending into unknown; the holder
	// may also record that it never dispatched (failed).
	Pending: {Succeeded, Accepted, Failed, Unknown},
	// Reconciliation settles an unknown outcome; an upstream-idempotent operation may
	// re-dispatch under the same upstream key (a new pending attempt).
	Unknown: {Succeeded, Failed, Pending},
	// A probe or a person settles what upstream queued.
	Accepted: {Succeeded, Failed},
	// A failed attempt may be retried as a new attempt.
	Failed: {Pending},
	// New calls replay a success; only a caller that judged a call a new intent over it
	// (ledger.ReserveParams.Supersede) starts a new pending attempt.
	Succeeded: {Pending},
}

// Transition returns nil when a residual may move from one state to another, and an error
// wrapping ErrInvalidTransition naming both states otherwise. Staying in the same state is
// not a transition and is refused too.
func Transition(from, to State) error {
	next, ok := transitions[from]
	if ok {
		for _, s := range next {
			if s == to {
				return nil
			}
		}
	}
	return fmt.Errorf("%w: %s → %s", ErrInvalidTransition, from, to)
}
