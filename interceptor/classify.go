package interceptor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/toolfence/toolfence/residual"
)

// Response is what a tool reports back from upstream.
type Response struct {
	// Body is the tool's result: returned to the caller and cached for replays.
	Body []byte
	// Status is the upstream status code, 0 when the upstream is not HTTP.
	Status int
	// Handle is the upstream handle (status URL, job id) of an accepted call.
	Handle string
	// Outcome optionally states the outcome outright; the classifier still refuses to
	// record a queued answer as a success.
	Outcome residual.State
}

// Classifier maps what a tool returned to one of Succeeded, Accepted, Failed or Unknown.
// It must be deterministic and must never return Succeeded for a queued answer.
type Classifier func(resp Response, err error) residual.State

// ErrNoEffect marks a tool error that proves upstream did nothing (a validation error, a
// refused request). Only errors wrapping it are classified as failed; every other error
// is an unknown outcome.
var ErrNoEffect = errors.New("interceptor: upstream did nothing")

// NoEffect wraps err to say upstream definitely did nothing, so the attempt is recorded as
// failed and may be retried. It returns nil for a nil err.
func NoEffect(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrNoEffect, err)
}

// queuedWords are body statuses that mean "accepted, not done".
var queuedWords = map[string]bool{
	"queued": true, "accepted": true, "pending": true, "processing": true,
	"in_progress": true, "in-progress": true, "scheduled": true, "running": true, "submitted": true,
}

// Queued reports whether an upstream answer means "accepted, not done yet": status 202, or a
// JSON body whose top-level "status" or "state" field is queued, accepted, pending,
// processing, in_progress, scheduled, running or submitted (case-insensitive).
func Queued(status int, body []byte) bool {
	if status == 202 {
		return true
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return false
	}
	var probe struct {
		Status any `json:"status"`
		State  any `json:"state"`
	}
	if json.Unmarshal(body, &probe) != nil {
		return false
	}
	for _, v := range []any{probe.Status, probe.State} {
		if s, ok := v.(string); ok && queuedWords[strings.ToLower(strings.TrimSpace(s))] {
			return true
		}
	}
	return false
}

// DefaultClassifier is the classifier of docs/design.md:
//   - an error wrapping ErrNoEffect → failed; any other error → unknown;
//   - a queued answer (see Queued) → accepted, whatever Outcome the tool claimed;
//   - an explicit Outcome → that outcome;
//   - HTTP 2xx (or no status) → succeeded; 400, 401, 403, 404, 422 → failed (the request
//     was refused before any effect); anything else (408, 409, 425, 429, 5xx…) → unknown.
func DefaultClassifier(resp Response, err error) residual.State {
	switch {
	case err != nil && errors.Is(err, ErrNoEffect):
		return residual.Failed
	case err != nil:
		return residual.Unknown
	case Queued(resp.Status, resp.Body):
		return residual.Accepted
	case resp.Outcome != residual.None:
		return resp.Outcome
	}
	if resp.Status == 0 {
		return residual.Succeeded
	}
	return StatusOutcome(resp.Status)
}

// Classify runs c (DefaultClassifier when nil) and enforces the invariants no classifier may
// break: the outcome is one of the four commit outcomes (anything else is unknown), an error
// is never a success, and a queued answer is never a success. Every surface that records an
// outcome (Do, the MCP server's commit_call) classifies through it. A panic in c propagates:
// each caller decides what it means (Do records unknown).
func Classify(c Classifier, resp Response, err error) residual.State {
	if c == nil {
		c = DefaultClassifier
	}
	out := c(resp, err)
	switch out {
	case residual.Succeeded:
		if err != nil {
			return residual.Unknown
		}
		if Queued(resp.Status, resp.Body) {
			return residual.Accepted
		}
		return out
	case residual.Accepted, residual.Failed, residual.Unknown:
		return out
	default:
		return residual.Unknown
	}
}

// classifyRan classifies the outcome of a call that ran: a classifier that panics yields
// unknown, since the call may have had its effect and its outcome must not be guessed.
func classifyRan(c Classifier, resp Response, err error) (out residual.State) {
	defer func() {
		if recover() != nil {
			out = residual.Unknown
		}
	}()
	return Classify(c, resp, err)
}
