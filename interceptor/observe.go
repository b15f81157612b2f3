package interceptor

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The observation texts: what a model reads when a guarded call did not simply run. Every
// surface that talks to a model shows them (tools' guarded tools, the MCP proxy), so a
// change here changes what every agent reads.

// ReplayPrefix starts the observation of a replayed call.
const ReplayPrefix = "[replayed] "

// ReplayNote is the head of a replay's observation, without the cached output:
// "[replayed] already done, outcome recorded at <RFC3339>", plus " (result truncated)" when
// the cached result was cut. Surfaces that return the cached result in their own shape (the
// MCP proxy) show it beside that result.
func ReplayNote(res *Result) string {
	var b strings.Builder
	b.WriteString(ReplayPrefix)
	b.WriteString("already done, outcome recorded at ")
	b.WriteString(res.RecordedAt.UTC().Format(time.RFC3339))
	if res.Truncated {
		b.WriteString(" (result truncated)")
	}
	return b.String()
}

// showTarget quotes a target for an observation; a joined target (a JSON array) is shown as is.
func showTarget(t string) string {
	if strings.HasPrefix(t, "[") && json.Valid([]byte(t)) {
		return t
	}
	return strconv.Quote(t)
}

// Observe renders an error of the interceptor (Do, Begin, Report) about a call of tool as
// the plain-language observation a model reads: what happened, whether upstream (named by
// upstream, e.g. "the upstream of send_email") may have been reached, and what to do next.
// res is the Result returned with the error, if any. It never fails; an error it does not
// know is shown as "toolfence: <tool> failed: <err>".
func Observe(tool, upstream string, res *Result, err error) string {
	var v *Violation
	if errors.As(err, &v) {
		return ObserveViolation(v, upstream)
	}
	switch {
	case errors.Is(err, ErrCallFailed) && errors.Is(err, ErrNoDispatch):
		return fmt.Sprintf("failed: %s did not send its request, so %s was not reached and nothing was done; "+
			"this is a fault in the tool, not in your input, so retrying will not help (%v)", tool, upstream, err)
	case errors.Is(err, ErrCallFailed):
		detail := err.Error()
		if res != nil && len(res.Output) > 0 {
			detail = string(res.Output)
		}
		return fmt.Sprintf("failed: %s refused the request and did nothing; you may correct the input and try again: %s", upstream, detail)
	case errors.Is(err, ErrNotDispatched):
		return fmt.Sprintf("not sent: toolfence could not record the attempt, so %s was not called; try again later: %v", upstream, err)
	case errors.Is(err, ErrNoTask):
		return fmt.Sprintf("toolfence: no task in the context, so %s was not run: %v", tool, err)
	case errors.Is(err, ErrInvalidCall), errors.Is(err, ErrArgsTooLarge):
		return fmt.Sprintf("invalid input for %s, nothing was sent: %v", tool, err)
	}
	return fmt.Sprintf("toolfence: %s failed: %v", tool, err)
}

// ObserveViolation renders v as the observation a model reads: which case it is (blocked,
// accepted, refused, not sent), whether up (the upstream's name) may have been reached, and
// the recovery due; it ends with the key. It never fails.
func ObserveViolation(v *Violation, up string) string {
	key := fmt.Sprintf("(key %s)", v.Key)
	switch v.Kind {
	case InProgress:
		wait := "until its lease expires"
		if v.RetryAfter > 0 {
			wait = fmt.Sprintf("in %s, when its lease expires", v.RetryAfter.Round(time.Millisecond))
		}
		return fmt.Sprintf("blocked: another attempt at %s on %s is still running and may reach %s; do not retry now — check again %s %s",
			v.Operation, showTarget(v.Target), up, wait, key)
	case UnknownOutcome:
		return fmt.Sprintf("blocked: a previous attempt may have reached %s; outcome unknown; do not retry — reconcile with toolfence %s",
			up, key)
	case AwaitingUpstream:
		handle := ""
		if v.Handle != "" {
			handle = fmt.Sprintf(" (status: %s)", v.Handle)
		}
		return fmt.Sprintf("accepted: %s accepted the request and is still working on it%s; it is not done yet; do not retry — wait, then check again %s",
			up, handle, key)
	case PayloadMismatch:
		when := ""
		if !v.Since.IsZero() {
			when = " on " + v.Since.UTC().Format(time.RFC3339)
		}
		return fmt.Sprintf("refused: %s on %s was already done%s with different arguments; it was not repeated; the first result stands: %s %s",
			v.Operation, showTarget(v.Target), when, v.Result, key)
	case LeaseLost:
		return fmt.Sprintf("blocked: this attempt lost its lease before its outcome was recorded and may have reached %s; do not retry — reconcile with toolfence %s",
			up, key)
	case MarginTooSmall:
		return fmt.Sprintf("not sent: too little lease time was left to call %s safely, so nothing was sent; you may try again %s",
			up, key)
	}
	return fmt.Sprintf("blocked: %s %s", v.Recovery, key)
}
