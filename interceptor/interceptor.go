package interceptor

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// Interceptor runs tool calls through the ordering barrier on a ledger. It is safe for
// concurrent use.
type Interceptor struct {
	ledger ledger.Ledger
	cfg    Config

	mu  sync.RWMutex
	ops map[string]Operation
}

// New returns an Interceptor over l. It returns an error wrapping ErrInvalidConfig when a
// setting is unusable.
func New(l ledger.Ledger, cfg Config) (*Interceptor, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: nil ledger", ErrInvalidConfig)
	}
	cfg.Namespace = cmp.Or(cfg.Namespace, DefaultNamespace)
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, DefaultLeaseTTL)
	cfg.Margin = cmp.Or(cfg.Margin, lease.DefaultMargin)
	cfg.MaxArgs = cmp.Or(cfg.MaxArgs, DefaultMaxArgs)
	cfg.MaxResult = cmp.Or(cfg.MaxResult, DefaultMaxResult)
	cfg.Clock = cmp.Or[lease.Clock](cfg.Clock, lease.Real{})
	if cfg.Classifier == nil {
		cfg.Classifier = DefaultClassifier
	}
	if cfg.Holder == "" {
		cfg.Holder = DefaultHolder()
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Interceptor{ledger: l, cfg: cfg, ops: maps.Clone(cfg.Operations)}, nil
}

// Register adds or replaces the policy of one operation. It returns an error wrapping
// ErrInvalidConfig for an empty name or a lease not longer than the margin.
func (ic *Interceptor) Register(name string, op Operation) error {
	if name == "" {
		return fmt.Errorf("%w: empty operation name", ErrInvalidConfig)
	}
	if err := ic.cfg.checkOperation(name, op); err != nil {
		return err
	}
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if ic.ops == nil {
		ic.ops = map[string]Operation{}
	}
	ic.ops[name] = op
	return nil
}

func (ic *Interceptor) operation(name string) Operation {
	ic.mu.RLock()
	defer ic.mu.RUnlock()
	return ic.ops[name]
}

// Ledger returns the ledger the interceptor writes to.
func (ic *Interceptor) Ledger() ledger.Ledger { return ic.ledger }

// Namespace returns the namespace of every key the interceptor derives.
func (ic *Interceptor) Namespace() string { return ic.cfg.Namespace }

// Holder returns the holder name the interceptor writes into leases.
func (ic *Interceptor) Holder() string { return ic.cfg.Holder }

// Key returns the key a call of operation on target within task gets.
func (ic *Interceptor) Key(task, operation, target string) string {
	return residual.Key(ic.cfg.Namespace, task, operation, target)
}

// Call is one guarded invocation. The task comes from the context (WithTask).
type Call struct {
	// Operation is the tool name (optionally versioned). Required.
	Operation string
	// Target is the thing mutated ("invoice:INV-42"). Required.
	Target string
	// Args are the call's arguments as JSON; the request digest is over their canonical
	// form. Empty means {}.
	Args json.RawMessage
}

// Dispatch is what the tool receives: the key to forward upstream as Idempotency-Key and
// the fencing token to fence its own writes with.
type Dispatch struct {
	Key       string
	Token     uint64
	Attempt   int
	Task      string
	Operation string
	Target    string
	Args      json.RawMessage
}

// ToolFunc performs the side effect. It must respect ctx: the context ends before the lease
// does. An error that proves upstream did nothing should wrap ErrNoEffect (see NoEffect).
type ToolFunc func(ctx context.Context, d Dispatch) (Response, error)

// Result says what Do did.
type Result struct {
	Key string
	// Output is the tool's result: fresh on execution, the cached (possibly redacted or
	// truncated) one on replay.
	Output []byte
	// Replayed is true when nothing was dispatched and Output comes from the ledger.
	Replayed bool
	// State is the recorded state: Succeeded, or Failed when returned with an error.
	State   residual.State
	Attempt int
	Token   uint64
	// Truncated says a replayed Output was cut at the result cap.
	Truncated bool
	// ResultDigest is the SHA-256 (hex) of the full result upstream returned.
	ResultDigest string
	// RecordedAt is when the outcome was recorded.
	RecordedAt time.Time
}

// Errors for calls that are refused before anything is reserved.
var (
	// ErrNoTask: the context carries no task (see WithTask).
	ErrNoTask = errors.New("interceptor: no task in context: wrap the context with interceptor.WithTask")
	// ErrInvalidCall: the call is malformed (missing operation or target, non-JSON args).
	ErrInvalidCall = errors.New("interceptor: invalid call")
	// ErrArgsTooLarge: the arguments exceed Config.MaxArgs.
	ErrArgsTooLarge = errors.New("interceptor: arguments too large")
	// ErrNotDispatched: the ledger could not record the reservation, or the caller's
	// context ended before dispatch (the attempt is then recorded failed), so the call was
	// not dispatched (fail closed).
	ErrNotDispatched = errors.New("interceptor: not dispatched")
	// ErrCallFailed: the tool ran and upstream confirmed no effect; the attempt is recorded
	// as failed and a new call may retry.
	ErrCallFailed = errors.New("interceptor: call failed with no effect")
	// ErrToolPanicked: the tool panicked; its outcome is unknown.
	ErrToolPanicked = errors.New("interceptor: tool panicked")
)

// Do runs fn through the ordering barrier for call, in the task carried by ctx:
//
//  1. reserve: one durable commit of a pending residual under a new lease and fencing
//     token; if it cannot be written, fn is not run (error wrapping ErrNotDispatched);
//  2. margin: the lease must have more than the margin left, or nothing is dispatched;
//  3. dispatch: fn runs under a context that ends before the lease does (renewed meanwhile);
//  4. classify: succeeded, accepted, failed or unknown;
//  5. commit: the outcome is written under the fence and the lease released.
//
// It returns a Result for a success (executed or replayed). For a call that ran and failed
// with no effect it returns the Result (State Failed, the tool's output) together with an
// error wrapping ErrCallFailed. Every other refusal or ambiguity is a *Violation: InProgress,
// UnknownOutcome (also when fn errs ambiguously or panics), AwaitingUpstream (also when fn
// answers 202 / queued), PayloadMismatch, LeasePreempted or MarginTooSmall. Malformed calls
// get errors wrapping ErrNoTask, ErrInvalidCall or ErrArgsTooLarge, and nothing is written.
func (ic *Interceptor) Do(ctx context.Context, call Call, fn ToolFunc) (*Result, error) {
	task, ok := TaskFrom(ctx)
	if !ok {
		return nil, ErrNoTask
	}
	digest, err := ic.checkCall(call)
	if err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("%w: nil tool function", ErrInvalidCall)
	}
	op := ic.operation(call.Operation)
	ttl := cmp.Or(op.LeaseTTL, ic.cfg.LeaseTTL)
	key := ic.Key(task, call.Operation, call.Target)

	// 1. Reserve. The local deadline is measured from before the request was sent, so it is
	// never later than the ledger's expiry, whatever the ledger's clock says.
	started := ic.cfg.Clock.Now()
	res, err := ic.ledger.Reserve(ctx, ledger.ReserveParams{
		Namespace: ic.cfg.Namespace, Key: key, Task: task, Operation: call.Operation,
		Target: call.Target, Holder: ic.cfg.Holder, RequestDigest: digest, TTL: ttl,
		Redispatch: op.UpstreamIdempotent,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s: reserve failed: %w", ErrNotDispatched, call.Operation, key, err)
	}
	switch res.Decision {
	case ledger.Acquired:
	case ledger.Replay:
		return replayResult(res.Residual), nil
	default:
		return nil, ic.blocked(res, started)
	}

	local := res.Lease
	local.Expires = started.Add(ttl)
	cur := res.Residual.Current()

	// 2. Pre-dispatch margin; a caller that gave up meanwhile gets nothing dispatched either.
	// The not-dispatched record is written even when ctx has ended.
	notDispatched := func(why error) error {
		_, err := ic.ledger.Commit(context.WithoutCancel(ctx), ledger.CommitParams{
			Namespace: ic.cfg.Namespace, Key: key, Holder: ic.cfg.Holder, Token: local.Token,
			Outcome: residual.Failed, Error: "not dispatched: " + why.Error(),
		})
		return err
	}
	if err := local.CheckMargin(ic.cfg.Clock.Now(), ic.cfg.Margin); err != nil {
		v := ic.violation(MarginTooSmall, res.Residual, cur, errors.Join(err, notDispatched(err)))
		v.State = residual.Failed
		return nil, v
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %s %s: the caller's context ended before dispatch: %w", ErrNotDispatched,
			call.Operation, key, errors.Join(context.Cause(ctx), notDispatched(err)))
	}

	// 3. Dispatch under a session that renews the lease and ends the call before it expires.
	sess := lease.KeepAlive(ctx, local, ic.renewer(key, ttl), lease.KeepAliveConfig{
		Clock: ic.cfg.Clock, Margin: ic.cfg.Margin, Interval: cmp.Or(ic.cfg.RenewEvery, ttl/3),
	})
	resp, callErr := invoke(sess.Ctx(), fn, Dispatch{
		Key: key, Token: local.Token, Attempt: cur.N, Task: task,
		Operation: call.Operation, Target: call.Target, Args: call.Args,
	})
	sess.Close()

	// 4. Classify.
	classifier := ic.cfg.Classifier
	if op.Classify != nil {
		classifier = op.Classify
	}
	outcome := classifyRan(classifier, resp, callErr)

	// 5. Commit under the fence.
	sum := sha256.Sum256(resp.Body)
	respDigest := hex.EncodeToString(sum[:])
	cached, truncated := ic.cacheable(call.Operation, resp.Body)
	p := ledger.CommitParams{
		Namespace: ic.cfg.Namespace, Key: key, Holder: ic.cfg.Holder, Token: local.Token,
		Outcome: outcome, ResponseDigest: respDigest, Result: cached, ResultDigest: respDigest,
		ResultTruncated: truncated, Handle: resp.Handle, Margin: ic.cfg.Margin,
	}
	if callErr != nil {
		p.Error = callErr.Error()
	}
	stored, err := ic.ledger.Commit(context.WithoutCancel(ctx), p)
	if err != nil {
		if stored == nil {
			stored = res.Residual
		}
		kind, cause := LeasePreempted, err
		if !errors.Is(err, residual.ErrLeaseLost) {
			// The outcome is known here but not durable: the key stays blocked until a
			// reconciler settles it.
			kind, cause = UnknownOutcome, fmt.Errorf("call ran (%s) but its outcome could not be recorded: %w", outcome, err)
		}
		v := ic.violation(kind, stored, cur, errors.Join(cause, callErr))
		v.Result, v.Handle = resp.Body, resp.Handle
		return nil, v
	}

	result := &Result{
		Key: key, Output: resp.Body, State: outcome, Attempt: cur.N, Token: local.Token,
		ResultDigest: respDigest, RecordedAt: stored.UpdatedAt,
	}
	switch outcome {
	case residual.Succeeded:
		return result, nil
	case residual.Failed:
		return result, fmt.Errorf("%w: %s on %q (attempt %d): %w", ErrCallFailed, call.Operation, call.Target, cur.N,
			cmp.Or(callErr, fmt.Errorf("upstream status %d", resp.Status)))
	case residual.Accepted:
		v := ic.violation(AwaitingUpstream, stored, cur, callErr)
		v.Result = resp.Body
		return nil, v
	default: // Unknown
		v := ic.violation(UnknownOutcome, stored, cur, cmp.Or(callErr, fmt.Errorf("upstream status %d", resp.Status)))
		v.Result = resp.Body
		return nil, v
	}
}

// checkCall validates a call and returns its request digest.
func (ic *Interceptor) checkCall(call Call) (string, error) {
	switch {
	case call.Operation == "":
		return "", fmt.Errorf("%w: operation is empty", ErrInvalidCall)
	case call.Target == "":
		return "", fmt.Errorf("%w: %s: target is empty", ErrInvalidCall, call.Operation)
	case len(call.Args) > ic.cfg.MaxArgs:
		return "", fmt.Errorf("%w: %s: %d bytes, the limit is %d", ErrArgsTooLarge, call.Operation, len(call.Args), ic.cfg.MaxArgs)
	}
	args := call.Args
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	d, err := residual.Digest(args)
	if err != nil {
		return "", fmt.Errorf("%w: %s: args are not valid JSON: %w", ErrInvalidCall, call.Operation, err)
	}
	return d, nil
}

// invoke runs fn, turning a panic into an error (an unknown outcome).
func invoke(ctx context.Context, fn ToolFunc, d Dispatch) (resp Response, err error) {
	defer func() {
		if p := recover(); p != nil {
			resp, err = Response{}, fmt.Errorf("%w: %v", ErrToolPanicked, p)
		}
	}()
	return fn(ctx, d)
}

// renewer renews the lease in the ledger; the local expiry is measured from before the call.
func (ic *Interceptor) renewer(key string, ttl time.Duration) lease.RenewFunc {
	return func(ctx context.Context, l lease.Lease) (lease.Lease, error) {
		before := ic.cfg.Clock.Now()
		if _, err := ic.ledger.Renew(ctx, ledger.RenewParams{
			Namespace: ic.cfg.Namespace, Key: key, Holder: ic.cfg.Holder, Token: l.Token, TTL: ttl,
		}); err != nil {
			return l, err
		}
		l.Expires = before.Add(ttl)
		return l, nil
	}
}

// Redact returns the form of an operation's result that may be stored: the result passed
// through Config.Redact (on a copy, so the caller's bytes are untouched), or the result
// itself when no redactor is set. A redactor that panics yields nil, so an unredacted secret
// is never stored. Every surface that caches results (Do, the MCP server's commit_call)
// stores what it returns.
func (ic *Interceptor) Redact(operation string, result []byte) (stored []byte) {
	if ic.cfg.Redact == nil {
		return result
	}
	defer func() {
		if recover() != nil {
			stored = nil
		}
	}()
	return ic.cfg.Redact(operation, bytes.Clone(result))
}

// cacheable applies redaction and the size cap to a result.
func (ic *Interceptor) cacheable(operation string, body []byte) ([]byte, bool) {
	body = ic.Redact(operation, body)
	if len(body) > ic.cfg.MaxResult {
		return body[:ic.cfg.MaxResult], true
	}
	return body, false
}

func replayResult(r *residual.Residual) *Result {
	res := &Result{
		Key: r.Key, Output: r.Result, Replayed: true, State: r.State, Token: r.Token,
		Truncated: r.ResultTruncated, ResultDigest: r.ResultDigest, RecordedAt: r.UpdatedAt,
	}
	if a := r.Current(); a != nil {
		res.Attempt = a.N
	}
	return res
}

// blocked turns a blocking reservation decision into a Violation.
func (ic *Interceptor) blocked(res *ledger.ReserveResult, now time.Time) *Violation {
	r := res.Residual
	kind := map[ledger.Decision]Kind{
		ledger.InProgress: InProgress, ledger.UnknownOutcome: UnknownOutcome,
		ledger.AwaitingUpstream: AwaitingUpstream, ledger.PayloadMismatch: PayloadMismatch,
	}[res.Decision]
	v := ic.violation(kind, r, r.Current(), nil)
	switch kind {
	case InProgress:
		if a := r.Current(); a != nil {
			v.RetryAfter = max(a.LeaseExpires.Sub(now), 0)
		}
	case AwaitingUpstream:
		v.Handle = r.Handle
	case PayloadMismatch:
		v.Result = r.Result
	}
	return v
}

func (ic *Interceptor) violation(kind Kind, r *residual.Residual, a *residual.Attempt, cause error) *Violation {
	v := &Violation{
		Kind: kind, Key: r.Key, Task: r.Task, Operation: r.Operation, Target: r.Target,
		State: r.State, Handle: r.Handle, Recovery: recoveries[kind], Cause: cause,
	}
	if a != nil {
		v.Attempt, v.Holder, v.Token, v.Since = a.N, a.Holder, a.Token, a.Started
	}
	return v
}
