package interceptor

import (
	"fmt"
	"strings"
	"time"

	"github.com/toolfence/toolfence/residual"
)

// Kind names the case of a Violation.
type Kind string

// Violation kinds.
const (
	// InProgress: another holder's live lease covers the key; the call may be in flight.
	InProgress Kind = "in_progress"
	// UnknownOutcome: a prior attempt may have reached upstream; nobody knows the outcome.
	UnknownOutcome Kind = "unknown_outcome"
	// AwaitingUpstream: upstream accepted the call (202 / queued); it is not a success yet.
	AwaitingUpstream Kind = "awaiting_upstream"
	// PayloadMismatch: the key already succeeded with other arguments.
	PayloadMismatch Kind = "payload_mismatch"
	// LeaseLost: the lease was lost (expired, preempted by a successor or a resolution)
	// before the outcome could be committed or the lease renewed; an outcome was kept as
	// evidence only. It wraps residual.ErrLeaseLost.
	LeaseLost Kind = "lease_lost"
	// MarginTooSmall: too little lease time was left to dispatch safely; nothing was sent.
	MarginTooSmall Kind = "margin_too_small"
)

// Kinds returns every violation kind, in a stable order.
func Kinds() []Kind {
	return []Kind{InProgress, UnknownOutcome, AwaitingUpstream, PayloadMismatch, LeaseLost, MarginTooSmall}
}

var kindSentinel = map[Kind]error{
	InProgress:       residual.ErrInProgress,
	UnknownOutcome:   residual.ErrUnknownOutcome,
	AwaitingUpstream: residual.ErrAwaitingUpstream,
	PayloadMismatch:  residual.ErrPayloadMismatch,
	LeaseLost:        residual.ErrLeaseLost,
	MarginTooSmall:   residual.ErrMarginTooSmall,
}

// Sentinel returns the residual sentinel error the kind wraps.
func (k Kind) Sentinel() error { return kindSentinel[k] }

// Violation is returned by Do when a call must not (or could not safely) run to a recorded
// outcome. It says which case applies and what recovery is due, names the key and the prior
// attempt, and wraps the kind's residual sentinel (and the cause, if any) for errors.Is.
type Violation struct {
	Kind      Kind
	Key       string
	Task      string
	Operation string
	Target    string
	// State is the residual's effective state when the violation was raised.
	State residual.State
	// Attempt, Holder and Token describe the prior (or, for LeaseLost and MarginTooSmall,
	// the caller's own) attempt.
	Attempt int
	Holder  string
	Token   uint64
	// Since is when that attempt started.
	Since time.Time
	// ResidualToken is the key's fencing token when the violation was raised
	// (residual.Residual.Token): for a settled key, that of the attempt or the resolution
	// that settled it, so it may be above Token. A PayloadMismatch names with it the
	// success a new intent may supersede (BeginOptions.Supersede).
	ResidualToken uint64
	// RetryAfter is how long until the lease expires (InProgress only).
	RetryAfter time.Duration
	// Handle is the upstream handle to poll (AwaitingUpstream).
	Handle string
	// Result is the recorded result of the key (PayloadMismatch: what the first call
	// returned; AwaitingUpstream: upstream's queued answer), or what this caller's tool returned when its outcome could not be
	// recorded authoritatively (LeaseLost, UnknownOutcome after a dispatch).
	Result []byte
	// ResultTruncated says Result was cut at the result cap when it was stored.
	ResultTruncated bool
	// RequestMatches says the key's recorded request digest equals this call's: a blocked
	// call is a retry of the recorded one, not a different request on the same key.
	RequestMatches bool
	// Recovery says, in a sentence, what to do next.
	Recovery string
	// Cause is the underlying error, if any (the tool's error, the ledger's refusal).
	Cause error

	// ran says the call was dispatched before the violation (Commit, Report): telemetry
	// counts it as executed.
	ran bool
}

// Error describes the violation in one line: kind, key, prior attempt, cause and recovery.
func (v *Violation) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "toolfence: %s: %s", v.Kind, v.Describe())
	if v.Recovery != "" {
		fmt.Fprintf(&b, "; recovery: %s", v.Recovery)
	}
	return b.String()
}

// Describe says what happened, without the kind and the recovery: the operation, key and
// target, the prior attempt and the cause.
func (v *Violation) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s on %q", v.Operation, v.Key, v.Target)
	if v.Attempt > 0 {
		fmt.Fprintf(&b, " (attempt %d by %s, token %d", v.Attempt, v.Holder, v.Token)
		if !v.Since.IsZero() {
			fmt.Fprintf(&b, ", since %s", v.Since.UTC().Format(time.RFC3339))
		}
		b.WriteString(")")
	}
	if v.Cause != nil {
		fmt.Fprintf(&b, ": %v", v.Cause)
	}
	return b.String()
}

// Unwrap returns the kind's sentinel and the cause, so errors.Is matches either.
func (v *Violation) Unwrap() []error {
	errs := []error{v.Kind.Sentinel()}
	if v.Cause != nil {
		errs = append(errs, v.Cause)
	}
	return errs
}
