package httpguard

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Problem types the guard answers with (RFC 9457 "type" members). Clients can match on them.
const (
	// ProblemMissingKey: 400, a guarded request without an Idempotency-Key.
	ProblemMissingKey = "urn:toolfence:problem:idempotency-key-missing"
	// ProblemInvalidKey: 400, the key is not a usable structured-field string.
	ProblemInvalidKey = "urn:toolfence:problem:idempotency-key-invalid"
	// ProblemUnreadableBody: 400, the request body could not be read.
	ProblemUnreadableBody = "urn:toolfence:problem:body-unreadable"
	// ProblemBodyTooLarge: 413, the body exceeds Options.MaxBody.
	ProblemBodyTooLarge = "urn:toolfence:problem:body-too-large"
	// ProblemUnauthorized: 401, Principal could not identify the caller.
	ProblemUnauthorized = "urn:toolfence:problem:unauthenticated"
	// ProblemForbidden: 403, Principal refused the caller.
	ProblemForbidden = "urn:toolfence:problem:forbidden"
	// ProblemInProgress: 409 with Retry-After, the first request with the key is in flight.
	ProblemInProgress = "urn:toolfence:problem:request-in-progress"
	// ProblemKeyReused: 422, the key was first used with another method, path or body.
	ProblemKeyReused = "urn:toolfence:problem:idempotency-key-reused"
	// ProblemReconciling: 409, the outcome of the first request is unknown until resolved.
	ProblemReconciling = "urn:toolfence:problem:outcome-being-reconciled"
	// ProblemHandlerPanic: 500, the handler panicked; its outcome is unknown.
	ProblemHandlerPanic = "urn:toolfence:problem:handler-panicked"
	// ProblemNotDispatched: 503, nothing was done (the ledger could not record the request).
	ProblemNotDispatched = "urn:toolfence:problem:not-dispatched"
	// ProblemNotReplayable: 500, the request was processed but its recorded response was
	// cut at the result cap.
	ProblemNotReplayable = "urn:toolfence:problem:response-not-replayable"
	// ProblemInternal: 500, the request could not be guarded; nothing was done.
	ProblemInternal = "urn:toolfence:problem:internal"
	// ProblemInvalidRequest: 400, the request's principal or key cannot make a key (for
	// example, a principal that is not valid UTF-8); nothing was done.
	ProblemInvalidRequest = "urn:toolfence:problem:invalid-request"
)

// Problem is an RFC 9457 problem details object, served as application/problem+json.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Residual is the toolfence key of the request's residual, for `toolfence show` and
	// `toolfence resolve` (an extension member).
	Residual string `json:"residual,omitempty"`
	// Recovery says what the client or an operator should do next (an extension member).
	Recovery string `json:"recovery,omitempty"`
}

// writeProblem writes p with its status; retryAfter, when positive, becomes a Retry-After
// header in whole seconds.
func writeProblem(w http.ResponseWriter, p Problem, retryAfterSeconds int) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen: Problem has only strings and an int
		body = []byte(`{"type":"about:blank","status":500}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if retryAfterSeconds > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfterSeconds))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
