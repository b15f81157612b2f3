package interceptor

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// ResolveParams settle one unknown or accepted residual of the interceptor's namespace.
type ResolveParams struct {
	Key string
	// As is Succeeded or Failed.
	As residual.State
	// By names who resolved (a person, an agent, a reconciler). Required.
	By string
	// Note says why: what was checked upstream and what was found. Required.
	Note string
	// Evidence is what upstream answered, for the audit.
	Evidence string
	// Result, when resolving as succeeded, is the result later calls replay. It is stored
	// the way every result is: redacted, then capped at Options.MaxResult (the digest is of
	// the whole). Nil keeps what is cached.
	Result []byte
	// IfToken, when not zero, makes the resolve conditional on the attempt the caller
	// looked at: it happens only if the residual's token (Residual.Token; a Violation's
	// Token names the same attempt) still equals IfToken. When a later attempt has begun
	// meanwhile nothing is written and Resolve returns an error wrapping
	// residual.ErrTokenChanged: what a probe found about one attempt says nothing about the
	// next, which may have had an effect. Zero resolves whatever attempt is current.
	IfToken uint64
}

// Resolve settles p.Key as succeeded or failed under a new fencing token (so the old
// holder's late commit is refused), records who resolved it and why, and releases any
// lease. It returns the stored residual. Errors: ErrInvalidCall for malformed parameters
// (nothing written); from the ledger, errors wrapping residual.ErrNotFound,
// residual.ErrInProgress (a live lease covers the key: wait for it to expire),
// residual.ErrInvalidTransition (already settled), residual.ErrTokenChanged (p.IfToken is
// no longer the residual's token), or the ledger's own.
func (ic *Interceptor) Resolve(ctx context.Context, p ResolveParams) (*residual.Residual, error) {
	switch {
	case residual.ValidKey(p.Key) != nil:
		return nil, fmt.Errorf("%w: %w", ErrInvalidCall, residual.ValidKey(p.Key))
	case p.As != residual.Succeeded && p.As != residual.Failed:
		return nil, fmt.Errorf("%w: resolve as %q: want succeeded or failed", ErrInvalidCall, p.As)
	case strings.TrimSpace(p.By) == "":
		return nil, fmt.Errorf("%w: resolve: say who resolves (by)", ErrInvalidCall)
	case strings.TrimSpace(p.Note) == "":
		return nil, fmt.Errorf("%w: resolve: a note is required (what was checked upstream and what was found)", ErrInvalidCall)
	case p.Result != nil && p.As != residual.Succeeded:
		return nil, fmt.Errorf("%w: resolve: a result is only kept when resolving as succeeded", ErrInvalidCall)
	}
	lp := ledger.ResolveParams{
		Namespace: ic.cfg.Namespace, Key: p.Key, As: p.As, By: p.By, Note: p.Note, Evidence: p.Evidence,
		IfToken: p.IfToken,
	}
	if p.Result != nil {
		r, err := ic.ledger.Get(ctx, ledger.GetParams{Namespace: ic.cfg.Namespace, Key: p.Key})
		if err != nil {
			return nil, err
		}
		s := ic.storable(r.Operation, p.Result)
		lp.Result, lp.ResultDigest, lp.ResultTruncated = s.bytes, s.digest, s.truncated
		if lp.Result == nil {
			lp.Result = []byte{} // a redactor that dropped everything still replaces the cache
		}
	}
	sctx, end := ic.tel.step(ctx, "resolve")
	r, err := ic.ledger.Resolve(sctx, lp)
	end(err)
	if err == nil && trace.SpanFromContext(ctx).IsRecording() {
		trace.SpanFromContext(ctx).SetAttributes(AttrKey.String(r.Key), AttrOutcome.String(r.State.String()), AttrToken.Int64(int64(r.Token)))
	}
	return r, err
}
