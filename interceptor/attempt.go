package interceptor

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// BeginOptions are the per-call settings of Begin. The zero value uses the interceptor's.
type BeginOptions struct {
	// Holder names the holder of the attempt in its lease and audit. Defaults to
	// Options.Holder. Surfaces whose callers are other processes (MCP) name each caller.
	Holder string
	// LeaseTTL is the lease of this attempt. Defaults to the operation's LeaseTTL, then
	// Options.LeaseTTL. It must be longer than the margin.
	LeaseTTL time.Duration
	// Settle, when set, is called once when the key is blocked by an unknown outcome or an
	// accepted attempt (a *Violation UnknownOutcome or AwaitingUpstream) to settle it, say
	// by asking upstream (the MCP proxy's probes and tasks/get) and calling Resolve. When it
	// returns true, Begin reserves again, once, and returns that: a replay, a new attempt or
	// a refusal. Only what Begin returns is counted and logged, so a key that Settle cleared
	// is not also reported as a refused call.
	Settle func(ctx context.Context, v *Violation) (settled bool)
	// Supersede, when not zero, says this call is a new intent, not a retry, over the
	// success the caller saw under this token: the Token of a replayed *Result, or the
	// ResidualToken of a PayloadMismatch *Violation. If the key is still that success,
	// Begin reserves a new attempt on the same key (attempt n+1, a new fencing token,
	// pending, with this call's arguments) and returns an *Attempt like any other; the
	// earlier attempts stay in the residual's history and its cached result is cleared.
	// Of several callers that supersede the same success at once, one gets the *Attempt
	// and the others InProgress. If the key has moved on (superseded or settled since),
	// the call is decided as without Supersede; a pending, unknown or accepted key still
	// blocks (ledger.ReserveParams.Supersede).
	//
	// Use it only where the caller itself has judged, from what it observed, that the same
	// call again is meant to act again (the earlier answer was delivered and then the call
	// came again, a person confirmed it), never to get past a replay it did not expect:
	// a retry of a lost answer must be replayed. Where the caller names the task, a new
	// intent is better a new task. The new attempt dispatches under the same key
	// (Dispatch.Key): for an operation declared UpstreamIdempotent, whose upstream would
	// answer the earlier call again, Begin refuses Supersede (ErrInvalidCall, nothing
	// written); a tool that forwards the key to an upstream that deduplicates by it must
	// not be superseded either, and a Probe that looks the key up upstream finds the
	// earlier intent's effect too, so it must tell the attempts apart (by the handle, the
	// token or the time of r.Current()). Zero (the default) replays a success.
	Supersede uint64
}

// Attempt is one attempt that holds its lease: steps 1 and 2 of the barrier are done (a
// pending residual is durable and the margin was left), so the caller may dispatch exactly
// once, then settle the attempt with Commit (Go tools: the outcome is classified from what
// the tool returned) or Report (surfaces where the caller dispatched and reports the
// outcome, such as MCP). An attempt that is never settled blocks its key as unknown once
// its lease expires; Abandon settles one that was not dispatched.
//
// An Attempt is safe for concurrent use; Renew may run while another goroutine dispatches.
type Attempt struct {
	ic  *Interceptor
	op  Operation
	ttl time.Duration

	// Dispatch is what the tool receives: the key to send upstream as Idempotency-Key
	// and the fencing token to fence its own writes with. Args is nil on a resumed
	// attempt.
	Dispatch Dispatch
	// Holder is the attempt's holder in the ledger; every later step is fenced on it.
	Holder string
	// Since is when the attempt started (the ledger's record).
	Since time.Time

	mu sync.Mutex
	// expires is the ledger's expiry of the lease; deadline the local one (never later).
	expires, deadline time.Time
	// last is the residual as the attempt last saw it.
	last *residual.Residual
}

// Lease returns the attempt's lease as the ledger recorded it (Expires at the ledger's
// clock) at the reservation or the last renewal.
func (a *Attempt) Lease() lease.Lease {
	a.mu.Lock()
	defer a.mu.Unlock()
	return lease.Lease{Resource: a.Dispatch.Key, Holder: a.Holder, Token: a.Dispatch.Token, Expires: a.expires}
}

// Deadline returns when the attempt must have committed by this process's clock: the
// lease's expiry measured from a reading taken before the reservation (or renewal) was
// sent, so it is never later than the ledger's. Commits need more than the margin left.
func (a *Attempt) Deadline() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.deadline
}

// TTL returns the lease length of the attempt.
func (a *Attempt) TTL() time.Duration { return a.ttl }

// Begin runs steps 1 and 2 of the ordering barrier for call, in the task carried by ctx:
//
//  1. reserve: one durable commit of a pending residual under a new lease and fencing
//     token; if it cannot be written, nothing may be dispatched (error wrapping
//     ErrNotDispatched);
//  2. margin: the lease must have more than the margin left, or the attempt is recorded
//     failed (not dispatched) and a MarginTooSmall violation is returned.
//
// Exactly one of its results is non-nil. An *Attempt means: dispatch once, then Commit or
// Report. A *Result means the key already succeeded with these arguments: replay it,
// dispatch nothing. An error means dispatch nothing: a *Violation (InProgress,
// UnknownOutcome, AwaitingUpstream, PayloadMismatch, MarginTooSmall), or an error wrapping
// ErrNoTask, ErrInvalidCall or ErrArgsTooLarge (nothing written) or ErrNotDispatched. An
// ErrNotDispatched that also wraps ledger.ErrOutcomeUnknown means the reservation may have
// landed: nothing was dispatched, but the key then reads unknown once its lease expires.
//
// Begin uses ctx for the reservation; a ctx that has ended by then gets ErrNotDispatched
// and the attempt is recorded failed. Callers whose client may go away mid-request (MCP)
// pass context.WithoutCancel.
//
// Begin sets the call's attributes (gen_ai.*, toolfence.*) on the span in ctx, makes a
// child span for the reservation, and counts a call it refuses or replays in
// toolfence.calls.
func (ic *Interceptor) Begin(ctx context.Context, call Call, opts BeginOptions) (*Attempt, *Result, error) {
	a, res, err := ic.begin(ctx, call, opts)
	var blocked *Violation
	if opts.Settle != nil && errors.As(err, &blocked) &&
		(blocked.Kind == UnknownOutcome || blocked.Kind == AwaitingUpstream) && opts.Settle(ctx, blocked) {
		a, res, err = ic.begin(ctx, call, opts)
	}
	switch {
	case a != nil:
	case res != nil:
		ic.tel.settle(ctx, call.Operation, resultReplayed, res, nil)
	default:
		result := resultError
		var v *Violation
		if errors.As(err, &v) {
			result = resultRefused
		}
		ic.tel.settle(ctx, call.Operation, result, nil, err)
	}
	return a, res, err
}

func (ic *Interceptor) begin(ctx context.Context, call Call, opts BeginOptions) (*Attempt, *Result, error) {
	task, ok := TaskFrom(ctx)
	annotateCall(ctx, ic.cfg.Namespace, task, call)
	if !ok {
		return nil, nil, ErrNoTask
	}
	digest, err := ic.checkCall(task, call)
	if err != nil {
		return nil, nil, err
	}
	op := ic.operation(call.Operation)
	ttl := cmp.Or(opts.LeaseTTL, op.LeaseTTL, ic.cfg.LeaseTTL)
	if ttl <= ic.cfg.Margin {
		return nil, nil, fmt.Errorf("%w: %s: lease %v is not longer than the safety margin %v", ErrInvalidCall, call.Operation, ttl, ic.cfg.Margin)
	}
	if opts.Supersede != 0 && op.UpstreamIdempotent {
		return nil, nil, fmt.Errorf("%w: %s: supersede of token %d: the operation is declared upstream-idempotent, so upstream "+
			"would answer a new intent under the same key with the earlier call's outcome; begin the new intent in a new task",
			ErrInvalidCall, call.Operation, opts.Supersede)
	}
	holder := cmp.Or(opts.Holder, ic.cfg.Holder)
	key := ic.Key(task, call.Operation, call.Target)

	// 1. Reserve. The local deadline is measured from before the request was sent, so it is
	// never later than the ledger's expiry, whatever the ledger's clock says.
	started := ic.cfg.Clock.Now()
	sctx, end := ic.tel.step(ctx, "reserve")
	res, err := ic.ledger.Reserve(sctx, ledger.ReserveParams{
		Namespace: ic.cfg.Namespace, Key: key, Task: task, Operation: call.Operation,
		Target: call.Target, Holder: holder, RequestDigest: digest, TTL: ttl,
		Redispatch: op.UpstreamIdempotent, Supersede: opts.Supersede,
	})
	end(err)
	if err != nil {
		annotateAttempt(ctx, key, 0, 0, "")
		if errors.Is(err, ledger.ErrInvalidParams) {
			return nil, nil, fmt.Errorf("%w: %s: %w", ErrInvalidCall, call.Operation, err)
		}
		return nil, nil, fmt.Errorf("%w: %s %s: reserve failed: %w", ErrNotDispatched, call.Operation, key, err)
	}
	if cur := res.Residual.Current(); cur != nil {
		annotateAttempt(ctx, key, cur.N, cur.Token, res.Decision.String())
	} else {
		annotateAttempt(ctx, key, 0, 0, res.Decision.String())
	}
	switch res.Decision {
	case ledger.Acquired:
	case ledger.Replay:
		return nil, replayResult(res.Residual), nil
	default:
		return nil, nil, ic.blocked(res, digest, started)
	}

	cur := res.Residual.Current()
	a := &Attempt{
		ic: ic, op: op, ttl: ttl, Holder: holder, Since: cur.Started,
		Dispatch: Dispatch{
			Key: key, Token: res.Lease.Token, Attempt: cur.N, Task: task,
			Operation: call.Operation, Target: call.Target, Args: call.Args,
		},
		expires: res.Lease.Expires, deadline: started.Add(ttl), last: res.Residual,
	}

	// 2. Pre-dispatch margin; a caller that gave up meanwhile gets nothing dispatched either.
	// The not-dispatched record is written even when ctx has ended.
	local := lease.Lease{Resource: key, Holder: holder, Token: a.Dispatch.Token, Expires: a.deadline}
	if err := local.CheckMargin(ic.cfg.Clock.Now(), ic.cfg.Margin); err != nil {
		v := ic.violation(MarginTooSmall, res.Residual, cur, errors.Join(err, a.Abandon(ctx, err)))
		v.State = residual.Failed
		return nil, nil, v
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("%w: %s %s: the caller's context ended before dispatch: %w", ErrNotDispatched,
			call.Operation, key, errors.Join(context.Cause(ctx), a.Abandon(ctx, err)))
	}
	return a, nil, nil
}

// ResumeParams name an attempt begun earlier, possibly by another request or process, and
// prove the caller is its holder: either Holder equals the recorded holder, or Authorize
// (called with the recorded holder) returns nil.
type ResumeParams struct {
	Key       string
	Token     uint64
	Holder    string
	Authorize func(recordedHolder string) error
}

// Resume returns the attempt of p.Key that holds p.Token, for a caller that proves to be its
// holder, so a later request can Renew, Commit, Report or Abandon it. It checks the record
// only: the ledger's fence still decides at each step whether the lease is live. It
// returns an error wrapping residual.ErrNotFound for a missing key, ErrInvalidCall for a
// malformed key, a zero token or no proof, a LeaseLost *Violation when no attempt of the
// key has the token or the proof fails (its Cause says why), or the ledger's error.
func (ic *Interceptor) Resume(ctx context.Context, p ResumeParams) (*Attempt, error) {
	if err := residual.ValidKey(p.Key); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidCall, err)
	}
	if p.Token == 0 || p.Holder == "" && p.Authorize == nil {
		return nil, fmt.Errorf("%w: resume needs a token and a holder", ErrInvalidCall)
	}
	r, err := ic.ledger.Get(ctx, ledger.GetParams{Namespace: ic.cfg.Namespace, Key: p.Key})
	if err != nil {
		return nil, err
	}
	var at *residual.Attempt
	for i := range r.Attempts {
		if r.Attempts[i].Token == p.Token {
			at = &r.Attempts[i]
		}
	}
	annotateCall(ctx, ic.cfg.Namespace, r.Task, Call{Operation: r.Operation})
	if at == nil {
		v := ic.violation(LeaseLost, r, nil, fmt.Errorf("token %d was never issued for key %s (its highest token is %d)", p.Token, r.Key, r.Token))
		v.Token = p.Token
		ic.tel.refused(ctx, "resume")
		spanError(ctx, v)
		return nil, v
	}
	proof := p.Authorize
	if proof == nil {
		proof = func(h string) error {
			if h != p.Holder {
				return fmt.Errorf("token %d of key %s is held by %s, not %s", p.Token, r.Key, h, p.Holder)
			}
			return nil
		}
	}
	annotateAttempt(ctx, r.Key, at.N, at.Token, "")
	if err := proof(at.Holder); err != nil {
		v := ic.violation(LeaseLost, r, at, err)
		ic.tel.refused(ctx, "resume")
		spanError(ctx, v)
		return nil, v
	}
	op := ic.operation(r.Operation)
	return &Attempt{
		ic: ic, op: op, ttl: cmp.Or(op.LeaseTTL, ic.cfg.LeaseTTL), Holder: at.Holder, Since: at.Started,
		Dispatch: Dispatch{Key: r.Key, Token: at.Token, Attempt: at.N, Task: r.Task, Operation: r.Operation, Target: r.Target},
		expires:  at.LeaseExpires, deadline: at.LeaseExpires, last: r,
	}, nil
}

// Renew extends the attempt's lease to ttl from now (the attempt's TTL when ttl is 0),
// fenced on its holder and token. It returns the renewed lease, or a LeaseLost *Violation
// when the ledger refuses (expired, preempted, stale token), or the ledger's error (the
// lease may then run out; retry while it lasts).
func (a *Attempt) Renew(ctx context.Context, ttl time.Duration) (lease.Lease, error) {
	ttl = cmp.Or(ttl, a.ttl)
	if ttl <= a.ic.cfg.Margin {
		return lease.Lease{}, fmt.Errorf("%w: lease %v is not longer than the safety margin %v", ErrInvalidCall, ttl, a.ic.cfg.Margin)
	}
	before := a.ic.cfg.Clock.Now()
	sctx, end := a.ic.tel.step(ctx, "renew")
	l, err := a.ic.ledger.Renew(sctx, ledger.RenewParams{
		Namespace: a.ic.cfg.Namespace, Key: a.Dispatch.Key, Holder: a.Holder, Token: a.Dispatch.Token, TTL: ttl,
	})
	end(err)
	a.ic.tel.renewed(ctx, err)
	if errors.Is(err, residual.ErrLeaseLost) {
		v := a.ic.violation(LeaseLost, a.snapshot(), a.self(), err)
		v.Recovery = recoveryRenewLost
		return lease.Lease{}, v
	}
	if err != nil {
		return lease.Lease{}, err
	}
	a.mu.Lock()
	a.expires, a.deadline = l.Expires, before.Add(ttl)
	a.mu.Unlock()
	return l, nil
}

// KeepAlive starts renewing the attempt's lease (every Options.RenewEvery, else TTL/3) for the
// duration of a dispatch, as Do does. The session's context (derived from ctx) ends before the
// lease does, or when a renewal is refused; run the dispatch under it and Close it after.
func (a *Attempt) KeepAlive(ctx context.Context) *lease.Session {
	cfg := a.ic.cfg
	return lease.KeepAlive(ctx, lease.Lease{Resource: a.Dispatch.Key, Holder: a.Holder, Token: a.Dispatch.Token, Expires: a.Deadline()},
		func(ctx context.Context, _ lease.Lease) (lease.Lease, error) {
			if _, err := a.Renew(ctx, 0); err != nil {
				return lease.Lease{}, err
			}
			return lease.Lease{Resource: a.Dispatch.Key, Holder: a.Holder, Token: a.Dispatch.Token, Expires: a.Deadline()}, nil
		},
		lease.KeepAliveOptions{Clock: cfg.Clock, Margin: cfg.Margin, Interval: cmp.Or(cfg.RenewEvery, a.TTL()/3)})
}

// Abandon records the attempt as failed and not dispatched, because of why, and releases
// its lease: the key is free for a new attempt. Call it only when the call provably never
// left the process. It returns the ledger's error, if any (the attempt then expires into
// unknown). It writes even when ctx has ended.
func (a *Attempt) Abandon(ctx context.Context, why error) error {
	sctx, end := a.ic.tel.step(context.WithoutCancel(ctx), "commit")
	_, err := a.ic.ledger.Commit(sctx, ledger.CommitParams{
		Namespace: a.ic.cfg.Namespace, Key: a.Dispatch.Key, Holder: a.Holder, Token: a.Dispatch.Token,
		Outcome: residual.Failed, Error: clip("not dispatched: "+why.Error(), ledger.MaxText),
	})
	end(err)
	return err
}

// Commit runs steps 4 and 5 for a call this process dispatched: it classifies what the
// tool returned (the operation's classifier, else the interceptor's; a panicking
// classifier yields unknown), stores the result (redacted, then capped) and writes the
// outcome under the fence, releasing the lease, in one durable step. It writes even when
// ctx has ended.
//
// Commit and Report answer in one shape. When the outcome was recorded, the Result is
// non-nil (its State is the outcome) and the error says what is due:
//
//   - succeeded: nil;
//   - failed: an error wrapping ErrCallFailed (upstream did nothing; a new call may retry);
//   - accepted: an AwaitingUpstream *Violation (poll the handle, then resolve);
//   - unknown: an UnknownOutcome *Violation (reconcile before any retry).
//
// When it was not recorded the Result is nil and the error is a *Violation: LeaseLost (the
// fence was lost: the outcome is kept as evidence only) or UnknownOutcome (the ledger could
// not record it, or may have). Commit's violations carry what the tool returned (Result).
//
// Commit sets the outcome on the span in ctx, makes a child span for the ledger's commit
// and counts the call as executed in toolfence.calls.
func (a *Attempt) Commit(ctx context.Context, resp Response, callErr error) (*Result, error) {
	res, err := a.commit(ctx, resp, callErr)
	a.ic.tel.settle(ctx, a.Dispatch.Operation, resultExecuted, res, err)
	return res, err
}

func (a *Attempt) commit(ctx context.Context, resp Response, callErr error) (*Result, error) {
	classifier := a.ic.cfg.Classifier
	if a.op.Classify != nil {
		classifier = a.op.Classify
	}
	outcome := classifyRan(classifier, resp, callErr)
	errText := ""
	if callErr != nil {
		errText = callErr.Error()
	}
	result, stored, err := a.record(ctx, outcome, resp.Body, resp.Handle, errText)
	if err != nil {
		v := a.lost(stored, err, outcome, callErr)
		v.Result, v.Handle = resp.Body, cmp.Or(v.Handle, resp.Handle)
		return nil, v
	}
	cause := cmp.Or(callErr, fmt.Errorf("upstream status %d", resp.Status))
	if outcome == residual.Accepted {
		cause = callErr
	}
	err = a.settled(stored, outcome, cause)
	if v, ok := errors.AsType[*Violation](err); ok {
		v.Result = resp.Body
	}
	return result, err
}

// settled is the answer of Commit and Report for an outcome the ledger recorded (stored):
// nil for a success, an error wrapping ErrCallFailed for a failure, and for an open outcome
// the *Violation whose recovery is due (AwaitingUpstream, UnknownOutcome). cause is what the
// call said (the tool's error, upstream's status, the reported error), or nil.
func (a *Attempt) settled(stored *residual.Residual, outcome residual.State, cause error) error {
	var kind Kind
	switch outcome {
	case residual.Succeeded:
		return nil
	case residual.Failed:
		d := a.Dispatch
		if cause == nil {
			return fmt.Errorf("%w: %s on %q (attempt %d)", ErrCallFailed, d.Operation, d.Target, d.Attempt)
		}
		return fmt.Errorf("%w: %s on %q (attempt %d): %w", ErrCallFailed, d.Operation, d.Target, d.Attempt, cause)
	case residual.Accepted:
		kind = AwaitingUpstream
	default: // Unknown
		kind = UnknownOutcome
	}
	v := a.ic.violation(kind, stored, a.self(), cause)
	v.ran = true
	return v
}

// Report is an outcome reported by a caller that dispatched the call itself.
type Report struct {
	// Outcome is the claimed outcome: Succeeded, Accepted, Failed or Unknown.
	Outcome residual.State
	// Status and Body are what upstream answered, if known; the claim is checked against
	// them (see Report on Attempt).
	Status int
	Body   []byte
	// Result is the result to cache and replay. Defaults to Body.
	Result []byte
	// Handle is the upstream handle of an accepted call.
	Handle string
	// Error is the call's error text, if any.
	Error string
}

// Report records an outcome the caller reports (step 5 for surfaces where the caller
// dispatched: MCP), after checking the claim with the operation's classifier: with an
// upstream status the classifier judges status and body alone; without one the claim
// stands unless the body reads as queued. A claim is accepted when it matches, or is more
// cautious (unknown always; accepted for what reads as a success). The result is stored
// redacted, then capped, and written under the fence in one durable step. It writes even
// when ctx has ended.
//
// Report answers a recorded outcome as Commit does: the Result (State is the outcome) with
// nil for succeeded, an error wrapping ErrCallFailed for failed, an AwaitingUpstream
// *Violation for accepted and an UnknownOutcome *Violation for unknown; a violation's Cause
// is the reported Error (else the upstream status), and it does not repeat the reported
// result. An identical report of an outcome already recorded for this attempt (a retry whose
// answer was lost) gets the same answer and writes nothing.
//
// Otherwise the Result is nil and nothing was recorded: a *ClaimError (wrapping
// ErrClaimRefused) when the claim is contradicted, nothing written; a LeaseLost *Violation
// when the fence was lost (the report kept as evidence only); an error wrapping
// ErrInvalidCall for an outcome that is not one of the four; otherwise the ledger's error
// (report again while the lease lasts; one wrapping ledger.ErrOutcomeUnknown may have
// landed, and the identical report then gets the recorded answer).
//
// Report sets the outcome on the span in ctx, makes a child span for the ledger's commit
// and counts a recorded (or fenced-off) outcome as an executed call in toolfence.calls.
func (a *Attempt) Report(ctx context.Context, rep Report) (*Result, error) {
	res, err := a.report(ctx, rep)
	var v *Violation
	switch {
	case err == nil, res != nil, errors.As(err, &v):
		a.ic.tel.settle(ctx, a.Dispatch.Operation, resultExecuted, res, err)
	default:
		spanError(ctx, err)
	}
	return res, err
}

func (a *Attempt) report(ctx context.Context, rep Report) (*Result, error) {
	switch rep.Outcome {
	case residual.Succeeded, residual.Accepted, residual.Failed, residual.Unknown:
	default:
		return nil, fmt.Errorf("%w: outcome %q: want succeeded, accepted, failed or unknown", ErrInvalidCall, rep.Outcome)
	}
	if err := a.checkClaim(rep); err != nil {
		return nil, err
	}
	result := rep.Result
	if result == nil {
		result = rep.Body
	}
	res, stored, err := a.record(ctx, rep.Outcome, result, rep.Handle, rep.Error)
	if errors.Is(err, residual.ErrLeaseLost) {
		return nil, a.lost(stored, err, rep.Outcome, nil)
	}
	if errors.Is(err, ledger.ErrOutcomeUnknown) {
		return nil, fmt.Errorf("%s %s: the outcome may or may not have been recorded: %w", a.Dispatch.Operation, a.Dispatch.Key, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: the outcome was not recorded: %w", a.Dispatch.Operation, a.Dispatch.Key, err)
	}
	return res, a.settled(stored, rep.Outcome, rep.cause())
}

// cause is what a report says about its outcome: its error text, else upstream's status
// (not for accepted: a 202 is no cause), else nil.
func (rep Report) cause() error {
	switch {
	case rep.Error != "":
		return errors.New(rep.Error)
	case rep.Status != 0 && rep.Outcome != residual.Accepted:
		return fmt.Errorf("upstream status %d", rep.Status)
	}
	return nil
}

// record stores body as the attempt's result and commits outcome under the fence.
func (a *Attempt) record(ctx context.Context, outcome residual.State, body []byte, handle, errText string) (*Result, *residual.Residual, error) {
	s := a.ic.storable(a.Dispatch.Operation, body)
	sctx, end := a.ic.tel.step(context.WithoutCancel(ctx), "commit")
	stored, err := a.ic.ledger.Commit(sctx, ledger.CommitParams{
		Namespace: a.ic.cfg.Namespace, Key: a.Dispatch.Key, Holder: a.Holder, Token: a.Dispatch.Token,
		Outcome: outcome, ResponseDigest: s.digest, Result: s.bytes, ResultDigest: s.digest,
		ResultTruncated: s.truncated, Handle: handle, Error: clip(errText, ledger.MaxText), Margin: a.ic.cfg.Margin,
	})
	end(err)
	if errors.Is(err, residual.ErrLeaseLost) {
		a.ic.tel.refused(ctx, "commit")
	}
	if err != nil {
		return nil, stored, err
	}
	a.mu.Lock()
	a.last = stored
	a.mu.Unlock()
	return &Result{
		Key: a.Dispatch.Key, Output: body, State: stored.State, Attempt: a.Dispatch.Attempt, Token: a.Dispatch.Token,
		StoredTruncated: s.truncated, ResultDigest: s.digest, Handle: stored.Handle, RecordedAt: stored.UpdatedAt,
	}, stored, nil
}

// lost turns a failed commit into a violation: LeaseLost when the fence refused it,
// UnknownOutcome when the outcome is known here but could not be made durable.
func (a *Attempt) lost(stored *residual.Residual, err error, outcome residual.State, callErr error) *Violation {
	if stored == nil {
		stored = a.snapshot()
	}
	kind, cause := LeaseLost, err
	switch {
	case errors.Is(err, ledger.ErrOutcomeUnknown):
		kind, cause = UnknownOutcome, fmt.Errorf("call ran (%s) but whether its outcome was recorded is unknown: %w", outcome, err)
	case !errors.Is(err, residual.ErrLeaseLost):
		kind, cause = UnknownOutcome, fmt.Errorf("call ran (%s) but its outcome could not be recorded: %w", outcome, err)
	}
	v := a.ic.violation(kind, stored, a.self(), errors.Join(cause, callErr))
	v.ran = true
	return v
}

// snapshot is the residual as the attempt last saw it.
func (a *Attempt) snapshot() *residual.Residual {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

// self describes the attempt for violations about it.
func (a *Attempt) self() *residual.Attempt {
	return &residual.Attempt{N: a.Dispatch.Attempt, Holder: a.Holder, Token: a.Dispatch.Token, Started: a.Since}
}

// stored is a result in the form the ledger keeps.
type stored struct {
	bytes     []byte
	truncated bool
	// digest is the SHA-256 (hex) of the whole result, before redaction and cap.
	digest string
}

// storable is the one path from a result to what the ledger stores: redacted (Options.Redact),
// then cut at Options.MaxResult; the digest is of the whole result. Every surface that stores
// a result (Commit, Report, Resolve, Reconcile's probes) goes through it.
func (ic *Interceptor) storable(operation string, result []byte) stored {
	sum := sha256.Sum256(result)
	s := stored{bytes: ic.Redact(operation, result), digest: hex.EncodeToString(sum[:])}
	if len(s.bytes) > ic.cfg.MaxResult {
		s.bytes, s.truncated = s.bytes[:ic.cfg.MaxResult], true
	}
	return s
}
