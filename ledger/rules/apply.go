package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// The Apply functions are the state rules of the ledger steps, as pure functions over an
// in-memory residual. Backends that load a residual, apply a step and write it back inside
// one transaction use them, so every backend enforces the same rules. now is the ledger's
// clock; token is the next fencing token for the key (one more than the highest issued).

// ApplyReserve applies Reserve to r (nil when no residual exists). When the decision is
// ledger.Acquired it returns the new or updated residual (r itself is modified when non-nil) and
// the new lease; otherwise it returns r unchanged with its effective state. A reserve that
// supersedes a success (Supersedes) also clears the cached result and handle.
func ApplyReserve(r *residual.Residual, p ledger.ReserveParams, token uint64, now time.Time) (ledger.Decision, *residual.Residual, lease.Lease) {
	d := Decide(r, p, now)
	if d != ledger.Acquired {
		r.State = r.EffectiveState(now)
		return d, r, lease.Lease{}
	}
	if Supersedes(r, p) {
		// A new intent: what the earlier one returned is never its outcome.
		r.Result, r.ResultDigest, r.ResultTruncated, r.Handle = nil, "", false, ""
	}
	if r == nil {
		r = &residual.Residual{
			Key: p.Key, Namespace: p.Namespace, Task: p.Task, Operation: p.Operation,
			Target: p.Target, CreatedAt: now,
		}
	}
	l := lease.Lease{Resource: p.Key, Holder: p.Holder, Token: token, Expires: now.Add(p.TTL)}
	if cur := r.Current(); cur != nil && cur.Outcome == residual.None {
		// An expired pending attempt being re-dispatched: it ended without an outcome.
		cur.Outcome, cur.Ended = residual.Unknown, now
	}
	r.State = residual.Pending
	r.RequestDigest = p.RequestDigest
	r.Token = token
	r.UpdatedAt = now
	n := AttemptCount(r) + 1
	r.Attempts = TrimAttempts(append(r.Attempts, residual.Attempt{
		N: n, Holder: p.Holder, Token: token, LeaseExpires: l.Expires,
		Started: now, RequestDigest: p.RequestDigest,
	}))
	r.AttemptCount = n
	return ledger.Acquired, r, l
}

// KeepAttempts is how many of the latest attempts a residual keeps besides the first one.
const KeepAttempts = 16

// TrimAttempts keeps the first attempt and the latest KeepAttempts of as (in order) and
// drops those in between: the first says how the key began, the latest what is happening
// now. It returns as itself when nothing is dropped.
func TrimAttempts(as []residual.Attempt) []residual.Attempt {
	if len(as) <= 1+KeepAttempts {
		return as
	}
	out := make([]residual.Attempt, 0, 1+KeepAttempts)
	out = append(out, as[0])
	return append(out, as[len(as)-KeepAttempts:]...)
}

// AttemptCount returns how many attempts were ever made at r's key: r.AttemptCount, or
// for a record written before it was counted, the N of the current attempt.
func AttemptCount(r *residual.Residual) int {
	if r == nil {
		return 0
	}
	n := r.AttemptCount
	if cur := r.Current(); cur != nil {
		n = max(n, cur.N)
	}
	return n
}

// fenceErr checks that the current attempt of r is pending under holder and token with more
// than margin left at now. It returns nil, or an error wrapping residual.ErrLeaseLost.
func fenceErr(r *residual.Residual, holder string, token uint64, margin time.Duration, now time.Time) error {
	cur := r.Current()
	switch {
	case cur == nil || r.State != residual.Pending || cur.Outcome != residual.None || cur.Released:
		return fmt.Errorf("%w: key %s is %s, not pending under token %d", residual.ErrLeaseLost, r.Key, r.EffectiveState(now), token)
	case cur.Token != token || r.Token != token:
		return fmt.Errorf("%w: key %s: token %d is stale, the current token is %d (held by %s)", residual.ErrLeaseLost, r.Key, token, r.Token, cur.Holder)
	case cur.Holder != holder:
		return fmt.Errorf("%w: key %s: token %d is held by %s, not %s", residual.ErrLeaseLost, r.Key, token, cur.Holder, holder)
	}
	l := lease.Lease{Resource: r.Key, Holder: holder, Token: token, Expires: cur.LeaseExpires}
	if err := l.CheckMargin(now, margin); err != nil {
		return fmt.Errorf("%w: %w", residual.ErrLeaseLost, err)
	}
	return nil
}

// ApplyCommit applies Commit to r and reports whether r changed (the backend must write it).
// Under a valid fence it writes the terminal outcome and releases the lease: true, nil. An
// identical retry of a commit that already landed (see Recorded) changes nothing and is
// answered as done: false, nil. Otherwise it appends the caller's observation as evidence
// (leaving the state alone) and returns true and an error wrapping residual.ErrLeaseLost.
func ApplyCommit(r *residual.Residual, p ledger.CommitParams, now time.Time) (bool, error) {
	if err := fenceErr(r, p.Holder, p.Token, p.Margin, now); err != nil {
		if Recorded(r, p) {
			r.State = r.EffectiveState(now)
			return false, nil
		}
		appendEvidence(r, residual.Evidence{
			At: now, Holder: p.Holder, Token: p.Token, Outcome: p.Outcome,
			ResponseDigest: p.ResponseDigest, Result: p.Result, Handle: p.Handle,
			Note: "late commit refused: " + err.Error(),
		})
		r.State = r.EffectiveState(now)
		r.UpdatedAt = now
		return true, err
	}
	cur := r.Current()
	cur.Outcome, cur.Ended, cur.Released = p.Outcome, now, true
	cur.ResponseDigest, cur.Error = p.ResponseDigest, p.Error
	r.State = p.Outcome
	r.UpdatedAt = now
	switch p.Outcome {
	case residual.Succeeded:
		r.Result, r.ResultDigest, r.ResultTruncated, r.Handle = p.Result, p.ResultDigest, p.ResultTruncated, p.Handle
	case residual.Accepted:
		r.Handle = p.Handle
		r.Result, r.ResultDigest, r.ResultTruncated = p.Result, p.ResultDigest, p.ResultTruncated
	}
	return true, nil
}

// Recorded reports whether p repeats a commit that already landed: the attempt that holds
// p.Token was settled by its own commit (not by a resolution or a takeover) from p.Holder
// with p's outcome and response digest, and, while the residual still stands as that
// commit left it, with p's result digest and handle. Such a retry (its first answer was
// lost) is answered with the recorded residual; a commit that differs in any of these is
// refused as a lost lease.
func Recorded(r *residual.Residual, p ledger.CommitParams) bool {
	for i := len(r.Attempts) - 1; i >= 0; i-- {
		a := &r.Attempts[i]
		if a.Token != p.Token {
			continue
		}
		if a.Holder != p.Holder || !a.Released || a.Outcome != p.Outcome || a.ResponseDigest != p.ResponseDigest {
			return false
		}
		for _, res := range r.Resolutions {
			if a.Outcome == residual.Unknown && res.At.Equal(a.Ended) {
				return false // a resolution released the attempt; its holder never committed
			}
		}
		if i == len(r.Attempts)-1 && r.State == p.Outcome && storesResult(p.Outcome) &&
			(r.ResultDigest != p.ResultDigest || r.Handle != p.Handle) {
			return false
		}
		return true
	}
	return false
}

// storesResult reports whether a commit of outcome stores the caller's result and handle.
func storesResult(outcome residual.State) bool {
	return outcome == residual.Succeeded || outcome == residual.Accepted
}

// Evidence bounds: refused commits cannot grow a residual without limit. The first
// MaxEvidence observations are kept (the ones closest to the original call); results over
// MaxEvidenceResult bytes keep only their response digest.
const (
	MaxEvidence       = 32
	MaxEvidenceResult = 4 << 10
)

// appendEvidence adds e to r within the evidence bounds and reports whether it was kept.
func appendEvidence(r *residual.Residual, e residual.Evidence) bool {
	if len(r.Evidence) >= MaxEvidence {
		return false
	}
	if len(e.Result) > MaxEvidenceResult {
		e.Result = nil
		e.Note = strings.TrimSpace(e.Note + " (result omitted: over the evidence size bound; see response_digest)")
	}
	r.Evidence = append(r.Evidence, e)
	return true
}

// ApplyEvidence applies AppendEvidence to r within the evidence bounds.
func ApplyEvidence(r *residual.Residual, e residual.Evidence, now time.Time) {
	if e.At.IsZero() {
		e.At = now
	}
	if appendEvidence(r, e) {
		r.UpdatedAt = now
	}
}

// ApplyRenew applies Renew to r: it extends the live lease of the attempt holding p.Token to
// now+p.TTL, or returns an error wrapping residual.ErrLeaseLost.
func ApplyRenew(r *residual.Residual, p ledger.RenewParams, now time.Time) (lease.Lease, error) {
	if err := fenceErr(r, p.Holder, p.Token, 0, now); err != nil {
		return lease.Lease{}, err
	}
	cur := r.Current()
	cur.LeaseExpires = now.Add(p.TTL)
	r.UpdatedAt = now
	return lease.Lease{Resource: r.Key, Holder: p.Holder, Token: p.Token, Expires: cur.LeaseExpires}, nil
}

// ApplyResolve applies Resolve to r with the new fencing token. When p.IfToken is set and is
// not r.Token it changes nothing and returns an error wrapping residual.ErrTokenChanged.
func ApplyResolve(r *residual.Residual, p ledger.ResolveParams, token uint64, now time.Time) error {
	from := r.EffectiveState(now)
	if p.IfToken != 0 && p.IfToken != r.Token {
		return fmt.Errorf("%w: key %s: resolve was conditional on token %d, but the residual's token is now %d (%s): a later attempt or resolution came first; look at it again",
			residual.ErrTokenChanged, r.Key, p.IfToken, r.Token, from)
	}
	switch from {
	case residual.Pending:
		cur := r.Current()
		return fmt.Errorf("%w: key %s is pending under a live lease (holder %s, token %d, expires %s); wait or let it expire",
			residual.ErrInProgress, r.Key, cur.Holder, cur.Token, cur.LeaseExpires.UTC().Format(time.RFC3339Nano))
	case residual.Unknown, residual.Accepted:
	default:
		return fmt.Errorf("%w: key %s is already %s; only unknown or accepted residuals can be resolved", residual.ErrInvalidTransition, r.Key, from)
	}
	if err := residual.Transition(from, p.As); err != nil {
		return err
	}
	if cur := r.Current(); cur != nil {
		if cur.Outcome == residual.None {
			cur.Outcome, cur.Ended = residual.Unknown, now
		}
		cur.Released = true
	}
	r.Resolutions = append(r.Resolutions, residual.Resolution{
		At: now, By: p.By, Token: token, From: from, To: p.As, Note: p.Note, Evidence: p.Evidence,
	})
	r.State = p.As
	r.Token = token
	r.UpdatedAt = now
	switch {
	case p.As == residual.Succeeded && p.Result != nil:
		digest := p.ResultDigest
		if digest == "" {
			sum := sha256.Sum256(p.Result)
			digest = hex.EncodeToString(sum[:])
		}
		r.Result, r.ResultDigest, r.ResultTruncated = p.Result, digest, p.ResultTruncated
	case from == residual.Accepted:
		// The stored body was upstream's "queued" answer, not the outcome: never replay it
		// as the result of a success (or keep it as one of a failure).
		r.Result, r.ResultDigest, r.ResultTruncated = nil, "", false
	}
	return nil
}

// Decide is the reservation rule every backend applies to an existing residual (r may be
// nil when none exists), so backends agree on it exactly. It reads p.RequestDigest,
// p.Redispatch and p.Supersede; now is the ledger's clock.
func Decide(r *residual.Residual, p ledger.ReserveParams, now time.Time) ledger.Decision {
	if r == nil {
		return ledger.Acquired
	}
	switch r.EffectiveState(now) {
	case residual.Pending:
		return ledger.InProgress
	case residual.Unknown:
		if p.Redispatch && r.RequestDigest == p.RequestDigest {
			return ledger.Acquired
		}
		return ledger.UnknownOutcome
	case residual.Accepted:
		return ledger.AwaitingUpstream
	case residual.Succeeded:
		switch {
		case Supersedes(r, p):
			return ledger.Acquired
		case r.RequestDigest == p.RequestDigest:
			return ledger.Replay
		}
		return ledger.PayloadMismatch
	default: // Failed
		return ledger.Acquired
	}
}

// Supersedes reports whether p starts a new intent over r (ledger.ReserveParams.Supersede):
// r is stored as succeeded and its token is p.Supersede.
func Supersedes(r *residual.Residual, p ledger.ReserveParams) bool {
	return p.Supersede != 0 && r != nil && r.State == residual.Succeeded && r.Token == p.Supersede
}

// PageLimit returns the effective page size of ledger.ListParams.Limit n: the default for
// n <= 0, at most ledger.MaxListLimit.
func PageLimit(n int) int {
	if n <= 0 {
		return ledger.DefaultListLimit
	}
	return min(n, ledger.MaxListLimit)
}

// Matches reports whether r passes the filters of p (namespace excluded), using r's
// effective State. Backends that filter in memory use it.
func Matches(p ledger.ListParams, r *residual.Residual) bool {
	if p.Task != "" && r.Task != p.Task ||
		p.Operation != "" && r.Operation != p.Operation ||
		p.Target != "" && r.Target != p.Target {
		return false
	}
	if len(p.States) == 0 {
		return true
	}
	for _, s := range p.States {
		if r.State == s {
			return true
		}
	}
	return false
}
