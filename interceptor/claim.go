package interceptor

import (
	"errors"
	"fmt"

	"github.com/toolfence/toolfence/residual"
)

// ErrClaimRefused is wrapped by a *ClaimError: a reported outcome that what upstream
// answered contradicts. Nothing was written.
var ErrClaimRefused = errors.New("interceptor: reported outcome refused")

// ErrClassifierPanicked is wrapped by Report's error when the operation's classifier
// panicked while checking a claim; nothing was written.
var ErrClassifierPanicked = errors.New("interceptor: classifier panicked")

// ClaimError refuses a reported outcome (Attempt.Report): Claimed is what the caller
// reported, Got what the operation's classifier reads in the upstream answer. It says why
// and what to report instead; the residual is unchanged.
type ClaimError struct {
	Claimed, Got residual.State
	// Why says what in the upstream answer contradicts the claim.
	Why string
	// Recovery says what to report instead.
	Recovery string
}

// Error describes the refusal in one line.
func (e *ClaimError) Error() string {
	return fmt.Sprintf("outcome %s refused: %s; the residual is unchanged", e.Claimed, e.Why)
}

// Unwrap returns ErrClaimRefused.
func (e *ClaimError) Unwrap() error { return ErrClaimRefused }

// checkClaim checks a reported outcome against what upstream answered; see Report. A
// classifier that panics refuses every claim but unknown (ErrClassifierPanicked).
func (a *Attempt) checkClaim(rep Report) (err error) {
	claimed := rep.Outcome
	if claimed == residual.Unknown {
		return nil
	}
	resp := Response{Body: rep.Body, Status: rep.Status, Handle: rep.Handle}
	if rep.Status == 0 {
		resp.Outcome = claimed
	}
	classifier := a.ic.cfg.Classifier
	if a.op.Classify != nil {
		classifier = a.op.Classify
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %s: %v; report the outcome as unknown", ErrClassifierPanicked, a.Dispatch.Operation, p)
		}
	}()
	got := Classify(classifier, resp, nil)
	if got == claimed || claimed == residual.Accepted && got == residual.Succeeded {
		return nil
	}
	return refusedClaim(claimed, got, rep.Status)
}

func refusedClaim(claimed, got residual.State, status int) *ClaimError {
	e := &ClaimError{Claimed: claimed, Got: got}
	if got == residual.Accepted {
		e.Why = "the upstream body says the work is queued / pending, which is not a confirmed effect"
		if status == 202 {
			e.Why = "upstream answered 202 Accepted, which is not a confirmed effect"
		}
		e.Recovery = "report it again as outcome=accepted with the handle (status URL or job id) so the key waits for upstream; " +
			"resolving or reconciling settles it once upstream finishes"
		return e
	}
	e.Why = fmt.Sprintf("the operation's classifier reads this upstream answer as %s", got)
	if status != 0 {
		e.Why = fmt.Sprintf("upstream status %d implies %s", status, got)
		switch got {
		case residual.Unknown:
			e.Why += " (a timeout, conflict, rate limit or server error does not prove that upstream did nothing)"
		case residual.Failed:
			e.Why += " (upstream refused the request before any effect)"
		}
	}
	switch got {
	case residual.Unknown:
		e.Recovery = "report it as outcome=unknown; the key then blocks until a reconcile or a resolution settles it after checking upstream"
	case residual.Succeeded:
		e.Recovery = "report it as outcome=succeeded (or accepted / unknown if you know less)"
	default:
		e.Recovery = fmt.Sprintf("report it as outcome=%s, or as outcome=unknown when you cannot tell", got)
	}
	return e
}
