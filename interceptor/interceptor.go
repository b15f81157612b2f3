package interceptor

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// Interceptor runs tool calls through the ordering barrier on a ledger. It is safe for
// concurrent use.
type Interceptor struct {
	ledger ledger.Ledger
	cfg    Options
	ops    *registry
	tel    *telemetry
}

// registry holds the operation policies; interceptors made by ForNamespace share one.
type registry struct {
	mu sync.RWMutex
	m  map[string]Operation
}

// New returns an Interceptor over l. It returns an error wrapping ErrInvalidOptions when a
// setting is unusable.
func New(l ledger.Ledger, cfg Options) (*Interceptor, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: nil ledger", ErrInvalidOptions)
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
	ops := &registry{m: maps.Clone(cfg.Operations)}
	if ops.m == nil {
		ops.m = map[string]Operation{}
	}
	cfg.Operations = nil // the registry is the one copy
	tel, err := newTelemetry(cfg, l)
	if err != nil {
		return nil, fmt.Errorf("%w: telemetry: %w", ErrInvalidOptions, err)
	}
	return &Interceptor{ledger: l, cfg: cfg, ops: ops, tel: tel}, nil
}

// ForNamespace returns an interceptor on the same ledger with the same settings in
// namespace ns. Both share one set of operation policies: Register on either applies to
// both. It returns an error wrapping ErrInvalidOptions for an empty namespace.
func (ic *Interceptor) ForNamespace(ns string) (*Interceptor, error) {
	if ns == "" {
		return nil, fmt.Errorf("%w: empty namespace", ErrInvalidOptions)
	}
	cfg := ic.cfg
	cfg.Namespace = ns
	return &Interceptor{ledger: ic.ledger, cfg: cfg, ops: ic.ops, tel: ic.tel}, nil
}

// Register adds or replaces the policy of one operation, for every surface that calls
// through this interceptor (and those made by ForNamespace). It returns an error wrapping
// ErrInvalidOptions for an empty name or a lease not longer than the margin.
func (ic *Interceptor) Register(name string, op Operation) error {
	if name == "" {
		return fmt.Errorf("%w: empty operation name", ErrInvalidOptions)
	}
	if err := ic.cfg.checkOperation(name, op); err != nil {
		return err
	}
	ic.ops.mu.Lock()
	defer ic.ops.mu.Unlock()
	ic.ops.m[name] = op
	return nil
}

// Operation returns the policy registered for an operation (the zero Operation when none).
func (ic *Interceptor) Operation(name string) Operation {
	ic.ops.mu.RLock()
	defer ic.ops.mu.RUnlock()
	return ic.ops.m[name]
}

func (ic *Interceptor) operation(name string) Operation { return ic.Operation(name) }

// Settings returns the interceptor's effective settings, defaults filled in. Operations is
// nil in it: see Operation.
func (ic *Interceptor) Settings() Options { return ic.cfg }

// TracesOff reports that no span would be recorded now: the interceptor's TracerProvider
// is OpenTelemetry's no-op one, or it is the global one and no provider has been installed
// yet. Surfaces built on the interceptor (the MCP proxy) check it to skip their own spans
// as the interceptor skips its own; a provider installed later turns it false.
func (ic *Interceptor) TracesOff() bool { return ic.tel.tracesOff() }

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
	// CallID is the model's id of this tool call, when the surface knows it; it goes into the
	// span (gen_ai.tool.call.id) only, never into the key.
	CallID string
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
// does. ctx carries d (DispatchFrom) for code below the tool. An error that proves upstream did nothing should wrap ErrNoEffect (see NoEffect).
type ToolFunc func(ctx context.Context, d Dispatch) (Response, error)

// Result says what Do did.
type Result struct {
	Key string
	// Output is the tool's result: fresh on execution, the cached (possibly redacted or
	// truncated) one on replay.
	Output []byte
	// Replayed is true when nothing was dispatched and Output comes from the ledger.
	Replayed bool
	// State is the recorded state: Succeeded with no error; Failed, Accepted or Unknown
	// when returned with the error that says so (Attempt.Commit).
	State   residual.State
	Attempt int
	// Token is the fencing token of the attempt that ran or, on a replay, the key's token
	// (residual.Residual.Token): what BeginOptions.Supersede names to start a new intent
	// over this success.
	Token uint64
	// Truncated says Output was cut at the result cap (a replay of a truncated result).
	Truncated bool
	// StoredTruncated says the stored result was cut at the cap, so replays of it will be:
	// on a replay it equals Truncated; on a fresh execution Output is whole.
	StoredTruncated bool
	// ResultDigest is the SHA-256 (hex) of the full result upstream returned.
	ResultDigest string
	// Handle is the upstream handle recorded with the outcome, if any.
	Handle string
	// RecordedAt is when the outcome was recorded (settled), which is not necessarily when
	// the effect happened upstream.
	RecordedAt time.Time
}

// Errors for calls that are refused before anything is reserved.
var (
	// ErrNoTask: the context carries no task (see WithTask).
	ErrNoTask = errors.New("interceptor: no task in context: wrap the context with interceptor.WithTask")
	// ErrInvalidCall: the call is malformed (missing operation or target, non-JSON args).
	ErrInvalidCall = errors.New("interceptor: invalid call")
	// ErrArgsTooLarge: the arguments exceed Options.MaxArgs.
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

// Do runs fn through the ordering barrier for call, in the task carried by ctx: Begin
// (reserve, margin), dispatch under a session that renews the lease and ends fn's context
// before the lease does, then Commit (classify, commit under the fence). A panic in fn is
// an unknown outcome.
//
// It returns a Result and no error for a success (executed or replayed). For a call that
// ran to a recorded outcome it answers as Attempt.Commit: the Result (State the outcome, the
// tool's output) with an error wrapping ErrCallFailed for failed, an AwaitingUpstream
// *Violation for accepted (also when fn answers 202 / queued) and an UnknownOutcome
// *Violation for unknown (also when fn errs ambiguously or panics). Every other refusal is a
// *Violation with a nil Result: InProgress, UnknownOutcome or AwaitingUpstream left by an
// earlier attempt, PayloadMismatch, LeaseLost, MarginTooSmall, or UnknownOutcome when the
// outcome could not be recorded. Malformed calls get errors wrapping ErrNoTask,
// ErrInvalidCall or ErrArgsTooLarge, and nothing is written; a reservation that could not
// be recorded gets ErrNotDispatched, and fn is not run.
//
// Do makes the span "execute_tool {operation}" (see Options.TracerProvider) and records the
// call in the metrics toolfence.calls and toolfence.call.duration.
func (ic *Interceptor) Do(ctx context.Context, call Call, fn ToolFunc) (*Result, error) {
	t := ic.tel
	if t.tracesOff() && t.metricsOff() {
		return ic.do(ctx, call, fn)
	}
	start := time.Now()
	ctx, span := t.start(ctx, "execute_tool "+call.Operation, trace.WithSpanKind(trace.SpanKindInternal))
	res, err := ic.do(ctx, call, fn)
	span.End()
	if t.metricsOff() {
		return res, err
	}
	result := resultExecuted
	switch {
	case res != nil && res.Replayed:
		result = resultReplayed
	case res == nil && !dispatched(err):
		result = resultRefused
		var v *Violation
		if !errors.As(err, &v) {
			result = resultError
		}
	}
	ic.tel.callDuration.Record(ctx, time.Since(start).Seconds(), ic.tel.attrs(labels{"dur", ic.tel.opLabel(call.Operation), result, ""},
		func() []attribute.KeyValue {
			return []attribute.KeyValue{attribute.String("operation", ic.tel.opLabel(call.Operation)), attribute.String("result", result)}
		}))
	return res, err
}

// dispatched says an error of Do came after the tool ran: a violation that Commit returned.
func dispatched(err error) bool {
	var v *Violation
	return errors.As(err, &v) && v.ran
}

func (ic *Interceptor) do(ctx context.Context, call Call, fn ToolFunc) (*Result, error) {
	if fn == nil {
		err := fmt.Errorf("%w: nil tool function", ErrInvalidCall)
		ic.tel.settle(ctx, call.Operation, resultError, nil, err)
		return nil, err
	}
	a, replay, err := ic.Begin(ctx, call, BeginOptions{})
	if a == nil {
		return replay, err
	}
	sess := a.KeepAlive(ctx)
	resp, callErr := invoke(WithDispatch(sess.Ctx(), a.Dispatch), fn, a.Dispatch)
	sess.Close()
	return a.Commit(ctx, resp, callErr)
}

// checkCall validates a call of task and returns its request digest. Every key field must
// be valid UTF-8: a decoder that replaced invalid bytes would otherwise collapse different
// intents onto one key.
func (ic *Interceptor) checkCall(task string, call Call) (string, error) {
	switch {
	case call.Operation == "":
		return "", fmt.Errorf("%w: operation is empty", ErrInvalidCall)
	case call.Target == "":
		return "", fmt.Errorf("%w: %s: target is empty", ErrInvalidCall, call.Operation)
	case len(call.Args) > ic.cfg.MaxArgs:
		return "", fmt.Errorf("%w: %s: %d bytes, the limit is %d", ErrArgsTooLarge, call.Operation, len(call.Args), ic.cfg.MaxArgs)
	}
	for _, f := range []struct{ name, v string }{{"task", task}, {"operation", call.Operation}, {"target", call.Target}} {
		if !utf8.ValidString(f.v) {
			return "", fmt.Errorf("%w: %s is not valid UTF-8 (%q)", ErrInvalidCall, f.name, truncate(f.v, 64))
		}
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

// truncate cuts s to at most n bytes.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// clip cuts s to at most n bytes at a rune boundary, marking the cut with "…": the texts a
// ledger stores are bounded (ledger.MaxText), and an error text must never keep an outcome
// from being recorded.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
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

// Redact returns the form of an operation's result that may be stored: the result passed
// through Options.Redact (on a copy, so the caller's bytes are untouched), or the result
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

func replayResult(r *residual.Residual) *Result {
	res := &Result{
		Key: r.Key, Output: r.Result, Replayed: true, State: r.State, Token: r.Token,
		Truncated: r.ResultTruncated, StoredTruncated: r.ResultTruncated, ResultDigest: r.ResultDigest, Handle: r.Handle,
		RecordedAt: r.UpdatedAt,
	}
	if a := r.Current(); a != nil {
		res.Attempt = a.N
	}
	return res
}

// blocked turns a blocking reservation decision into a Violation.
func (ic *Interceptor) blocked(res *ledger.ReserveResult, digest string, now time.Time) *Violation {
	r := res.Residual
	kind := map[ledger.Decision]Kind{
		ledger.InProgress: InProgress, ledger.UnknownOutcome: UnknownOutcome,
		ledger.AwaitingUpstream: AwaitingUpstream, ledger.PayloadMismatch: PayloadMismatch,
	}[res.Decision]
	v := ic.violation(kind, r, r.Current(), nil)
	v.RequestMatches = r.RequestDigest == digest
	switch kind {
	case InProgress:
		if a := r.Current(); a != nil {
			v.RetryAfter = max(a.LeaseExpires.Sub(now), 0)
		}
	case AwaitingUpstream:
		v.Handle, v.Result, v.ResultTruncated = r.Handle, r.Result, r.ResultTruncated
	case PayloadMismatch:
		v.Result, v.ResultTruncated = r.Result, r.ResultTruncated
	}
	return v
}

func (ic *Interceptor) violation(kind Kind, r *residual.Residual, a *residual.Attempt, cause error) *Violation {
	v := &Violation{
		Kind: kind, Key: r.Key, Task: r.Task, Operation: r.Operation, Target: r.Target,
		State: r.State, Handle: r.Handle, Recovery: recoveries[kind], Cause: cause,
		ResidualToken: r.Token,
	}
	if a != nil {
		v.Attempt, v.Holder, v.Token, v.Since = a.N, a.Holder, a.Token, a.Started
	}
	return v
}
