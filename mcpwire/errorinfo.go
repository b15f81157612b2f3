package mcpwire

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
)

// Kind is the kind of an isError result (ErrorInfo.Kind): a stable token clients can
// compare. A kind that is also a violation kind has the interceptor's name for it
// (Kind(v.Kind) of an *interceptor.Violation v).
type Kind string

// The kinds of isError results.
const (
	// KindInvalidInput: the arguments or the task are malformed; nothing was written or sent.
	KindInvalidInput Kind = "invalid_input"
	// KindNotFound: no residual with the key in this namespace.
	KindNotFound Kind = "not_found"
	// KindRefused: a reported outcome contradicts what upstream answered; nothing written.
	KindRefused Kind = "refused"
	// KindInvalidTransition: the residual is already settled.
	KindInvalidTransition Kind = "invalid_transition"
	// KindUnavailable: the ledger (or, for the proxy, the upstream's tool list) failed;
	// nothing was sent: try again later.
	KindUnavailable Kind = "unavailable"
	// KindInternal: a bug on the server's side.
	KindInternal Kind = "internal"
	// KindPolicy: the proxy's policy does not fit the upstream (a tool it names is not listed).
	KindPolicy Kind = "policy"
	// KindPin: the proxy refused a call because its tool's definition differs from its pin
	// (or has none); nothing was sent.
	KindPin Kind = "pin"

	// KindInProgress: a live lease covers the key (interceptor.InProgress).
	KindInProgress = Kind(interceptor.InProgress)
	// KindUnknownOutcome: a previous attempt may have reached upstream (interceptor.UnknownOutcome).
	KindUnknownOutcome = Kind(interceptor.UnknownOutcome)
	// KindAwaitingUpstream: upstream accepted the call and is still working on it
	// (interceptor.AwaitingUpstream).
	KindAwaitingUpstream = Kind(interceptor.AwaitingUpstream)
	// KindPayloadMismatch: the key succeeded with other arguments (interceptor.PayloadMismatch).
	KindPayloadMismatch = Kind(interceptor.PayloadMismatch)
	// KindLeaseLost: the fence was lost or the caller is not the attempt's holder
	// (interceptor.LeaseLost).
	KindLeaseLost = Kind(interceptor.LeaseLost)
	// KindMarginTooSmall: too little lease time was left to dispatch (interceptor.MarginTooSmall).
	KindMarginTooSmall = Kind(interceptor.MarginTooSmall)
)

// ErrorInfo is the structured details of an isError tool result: {"error": ErrorInfo} in an
// mcpserver tool's structured content, _meta[MetaError] in a result of the proxy.
type ErrorInfo struct {
	// Kind is one of the Kind constants.
	Kind      Kind       `json:"kind"`
	Message   string     `json:"message"`
	Recovery  string     `json:"recovery,omitempty"`
	Violation *Violation `json:"violation,omitempty"`
}

// Violation says why a call is blocked, or why a commit or renewal was fenced out.
type Violation struct {
	// Kind is the interceptor's violation kind: in_progress, unknown_outcome,
	// awaiting_upstream, payload_mismatch, margin_too_small or lease_lost.
	Kind     interceptor.Kind `json:"kind"`
	Message  string           `json:"message"`
	Recovery string           `json:"recovery"`
	State    residual.State   `json:"state,omitempty"`
	Attempt  int              `json:"attempt,omitempty"`
	Holder   string           `json:"holder,omitempty"`
	Token    uint64           `json:"token,omitempty"`
	Since    time.Time        `json:"since,omitzero"`
	// RetryAfterMS is how long until the live lease expires (in_progress).
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
	Handle       string `json:"handle,omitempty"`
	// Result is what the key's first success returned (payload_mismatch).
	Result json.RawMessage `json:"result,omitempty"`
}

// ViolationView returns the wire form of an interceptor violation: the structured details
// that isError results carry. It never fails.
func ViolationView(v *interceptor.Violation) *Violation {
	return &Violation{
		Kind: v.Kind, Message: v.Describe(), Recovery: v.Recovery, State: v.State, Attempt: v.Attempt,
		Holder: v.Holder, Token: v.Token, Since: v.Since, RetryAfterMS: v.RetryAfter.Milliseconds(),
		Handle: v.Handle, Result: JSONValue(v.Result),
	}
}

// ViolationInfo returns the ErrorInfo of an interceptor violation, with message as its
// Message (v.Describe(), or a surface's sentence around it).
func ViolationInfo(v *interceptor.Violation, message string) ErrorInfo {
	return ErrorInfo{Kind: Kind(v.Kind), Message: message, Recovery: v.Recovery, Violation: ViolationView(v)}
}

// JSONValue returns recorded bytes as a JSON value for the wire: a copy of b when it is
// JSON, else b as a JSON string (invalid UTF-8 replaced), and nil for no bytes.
func JSONValue(b []byte) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	if json.Valid(b) {
		return append(json.RawMessage(nil), b...)
	}
	s, _ := json.Marshal(strings.ToValidUTF8(string(b), "\uFFFD"))
	return s
}
