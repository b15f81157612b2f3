package remote

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// Path is the prefix under which Handler's methods are served, and the default path of a
// Client's endpoint.
const Path = "/ledger/v1/"

// Errors of the transport. Errors of the ledger behind Handler come back wrapping the same
// sentinels of packages ledger, lease and residual as on the server. Besides these, a
// server that could not be reached (nothing listens, the socket is gone) or whose ledger is
// closed gives an error wrapping ledger.ErrUnavailable (the step did not happen; it may be
// repeated), a refused bearer token ledger.ErrUnauthorized (401), and a namespace the
// request's access does not cover, or a web page's request (an Origin header that is not
// loopback), ledger.ErrForbidden (403).
var (
	// ErrConnectionLost: the request was sent but no answer came (the connection broke,
	// the server died, the request timed out), or the answer was not this server's (a 5xx
	// without an error code of this protocol, a 200 without a result). For a mutating step
	// the error also wraps ledger.ErrOutcomeUnknown: the step may have happened.
	ErrConnectionLost = errors.New("remote: connection lost before the answer")
	// ErrBusy: the server refused the step for its bounds on steps in progress or watch
	// streams (429, with Retry-After). The step did not run; it may be repeated later. It
	// also wraps ledger.ErrUnavailable.
	ErrBusy = fmt.Errorf("remote: busy: %w", ledger.ErrUnavailable)
	// ErrNotGranted: the request's bearer token is known to the server but not granted the
	// ledger protocol (403): it serves MCP only.
	ErrNotGranted = errors.New("remote: token not granted the ledger protocol")
	// ErrNotHolder: a reserve, commit or renew of a request bound to a namespace carried
	// no proof of holding (403). Nothing was written.
	ErrNotHolder = errors.New("remote: not the holder")
	// ErrProtocol: the server refused the request as malformed (400, 404, 405, 413, 415),
	// or answered a read with something that is not this protocol.
	ErrProtocol = errors.New("remote: protocol error")
	// ErrInvalidEndpoint: the endpoint given to New is not an http, https or unix URL.
	ErrInvalidEndpoint = errors.New("remote: invalid endpoint")
)

// codes names every sentinel that crosses the wire. The order is the order of Unwrap.
var codes = []struct {
	code string
	err  error
}{
	{"invalid_params", ledger.ErrInvalidParams},
	{"outcome_unknown", ledger.ErrOutcomeUnknown},
	{"closed", lease.ErrClosed},
	{"not_found", residual.ErrNotFound},
	{"in_progress", residual.ErrInProgress},
	{"unknown_outcome", residual.ErrUnknownOutcome},
	{"awaiting_upstream", residual.ErrAwaitingUpstream},
	{"payload_mismatch", residual.ErrPayloadMismatch},
	{"lease_lost", residual.ErrLeaseLost},
	{"margin_too_small", residual.ErrMarginTooSmall},
	{"invalid_transition", residual.ErrInvalidTransition},
	{"token_changed", residual.ErrTokenChanged},
	{"invalid_state", residual.ErrInvalidState},
	{"invalid_key", residual.ErrInvalidKey},
	{"invalid_json", residual.ErrInvalidJSON},
	{"busy", ErrBusy},
	{"unavailable", ledger.ErrUnavailable},
	{"unauthorized", ledger.ErrUnauthorized},
	{"not_holder", ErrNotHolder},
	{"not_granted", ErrNotGranted},
	{"forbidden", ledger.ErrForbidden},
	{"protocol", ErrProtocol},
}

// envelope is every answer but watch's.
type envelope struct {
	Result any        `json:"result,omitempty"`
	Error  *wireError `json:"error,omitempty"`
}

// wireError is an error on the wire: its text and the codes of the sentinels it wraps.
type wireError struct {
	Message string   `json:"message"`
	Codes   []string `json:"codes,omitempty"`
}

// toWire returns err's text and the codes of every known sentinel it wraps.
func toWire(err error) *wireError {
	w := &wireError{Message: err.Error()}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			w.Codes = append(w.Codes, c.code)
		}
	}
	return w
}

// Error is an error the server answered. Its text is the server's; errors.Is matches every
// sentinel the server's error wrapped (of packages ledger and residual, and this package's
// ledger.ErrUnavailable, ErrUnauthorized, ErrForbidden, and ErrProtocol). Codes the client does not
// know are kept in Codes and match nothing.
type Error struct {
	// Method is the step ("reserve", …).
	Method string
	// Status is the HTTP status of the answer (200 for the backend's own errors).
	Status int
	// Message is the server's error text.
	Message string
	// Codes name the sentinels the server's error wrapped.
	Codes []string
}

// Error returns the server's text.
func (e *Error) Error() string {
	if e.Status == http.StatusOK {
		return e.Message
	}
	return fmt.Sprintf("remote ledger %s: %d %s: %s", e.Method, e.Status, http.StatusText(e.Status), e.Message)
}

// Unwrap returns the sentinels named by Codes.
func (e *Error) Unwrap() []error {
	var out []error
	for _, code := range e.Codes {
		for _, c := range codes {
			if c.code == code {
				out = append(out, c.err)
			}
		}
	}
	return out
}

// fromWire rebuilds the error of an answer.
func fromWire(method string, status int, w *wireError) *Error {
	return &Error{Method: method, Status: status, Message: strings.TrimSpace(w.Message), Codes: w.Codes}
}
