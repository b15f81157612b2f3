package httpguard

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// Header names of the draft and of the replay marker.
const (
	// KeyHeader is the request header that carries the idempotency key.
	KeyHeader = "Idempotency-Key"
	// ReplayHeader is set to "true" on every response that was replayed from the ledger
	// instead of produced by the handler.
	ReplayHeader = "Idempotent-Replayed"
)

// Defaults of Options.
const (
	DefaultOperation  = "http"
	DefaultMaxBody    = 1 << 20 // 1 MiB
	DefaultRetryAfter = time.Second
)

// DefaultMethods are the methods guarded when Options.Methods is empty.
var DefaultMethods = []string{http.MethodPost, http.MethodPatch}

// DefaultReplayHeaders are the response headers stored and replayed when
// Options.ReplayHeaders is empty. Set-Cookie and other per-response headers are left out
// on purpose.
var DefaultReplayHeaders = []string{
	"Content-Type", "Content-Encoding", "Content-Language", "Content-Location", "Location",
	"ETag", "Last-Modified",
}

// A Principal function refuses a request with an error wrapping ledger.ErrUnauthorized (the
// caller could not be identified → 401) or ledger.ErrForbidden (the caller is known but may
// not use the endpoint → 403). Any other error is treated like ledger.ErrUnauthorized.
var ()

// Options configure a Guard. Only Principal is required.
type Options struct {
	// Principal returns who is calling (a tenant, user or agent id): keys are scoped by it,
	// so two principals never share a key, and it is the task of every residual. An error
	// wrapping ledger.ErrForbidden answers 403, any other error or an empty principal 401.
	// Required.
	Principal func(r *http.Request) (string, error)
	// Methods are the guarded methods, compared with the request's method without regard to
	// case (a request sent as "post" is a POST); other methods pass through unguarded.
	// Defaults to DefaultMethods (POST and PATCH).
	Methods []string
	// Operation is the operation name of the residuals (see interceptor.Register to give it
	// a probe). Defaults to "http".
	Operation string
	// ReplayHeaders are the response headers stored and replayed. Defaults to
	// DefaultReplayHeaders.
	ReplayHeaders []string
	// MaxBody caps the request body read for the fingerprint; a longer body gets 413.
	// Defaults to 1 MiB.
	MaxBody int64
	// RequireQuotedKey accepts only the draft's form of the key, an RFC 8941 structured-field
	// string (Idempotency-Key: "8e03978e-…"), and answers 400 to a bare key. Defaults to
	// false: a bare key of visible ASCII without '"', '\\', ',' or ';' (Idempotency-Key:
	// 8e03978e-…, as most APIs and their clients send it) is accepted too, and is the same
	// key as its quoted form.
	RequireQuotedKey bool
	// Classify maps the handler's status to an outcome. Defaults to DefaultClassify.
	Classify func(status int) residual.State
	// RetryAfter is the longest Retry-After hint sent with a 409 for a request in flight
	// (never longer than the lease). Defaults to 1s.
	RetryAfter time.Duration
	// Challenge is the WWW-Authenticate value sent with a 401. Defaults to "Bearer".
	Challenge string
	// Logger receives handler panics and unrecorded outcomes. Defaults to slog.Default().
	Logger *slog.Logger
	// Propagator reads the caller's trace context (W3C traceparent and tracestate with
	// propagation.TraceContext) from the request headers, so the guarded call's
	// execute_tool span is a child of the caller's span. It is used only when the request's
	// context carries no span yet (otelhttp or another middleware already extracted it).
	// Defaults to otel.GetTextMapPropagator(), the program's global propagator (a no-op
	// until the program sets one; toolfence serve sets W3C trace context and baggage).
	Propagator propagation.TextMapPropagator
}

// DefaultClassify is the classification of a guarded handler's status. The handler runs in
// this process, so its own answer is trusted: 202 → accepted (never a success); other 2xx
// and 3xx → succeeded; 4xx → failed (the handler refused the request and must not have
// made an effect; a retry runs it again); anything else (5xx) → unknown.
func DefaultClassify(status int) residual.State {
	switch {
	case status == http.StatusAccepted:
		return residual.Accepted
	case status >= 200 && status < 400:
		return residual.Succeeded
	case status >= 400 && status < 500:
		return residual.Failed
	default:
		return residual.Unknown
	}
}

// Guard is the Idempotency-Key middleware over one interceptor. It is safe for concurrent
// use; wrap any number of handlers with it.
type Guard struct {
	ic      *interceptor.Interceptor
	opts    Options
	methods map[string]bool
}

// invalidOptions is New's error for unusable options: "httpguard: invalid options: " and
// the detail, wrapping interceptor.ErrInvalidOptions.
func invalidOptions(format string, args ...any) error {
	return interceptor.InvalidOptions("httpguard: invalid options", format, args...)
}

// New returns a Guard over ic. It returns an error wrapping interceptor.ErrInvalidOptions when ic or
// Principal is nil or a setting is negative.
func New(ic *interceptor.Interceptor, opts Options) (*Guard, error) {
	switch {
	case ic == nil:
		return nil, invalidOptions("nil interceptor")
	case opts.Principal == nil:
		return nil, invalidOptions("Principal is required (keys are scoped by the caller)")
	case opts.MaxBody < 0:
		return nil, invalidOptions("MaxBody %d is negative", opts.MaxBody)
	case opts.RetryAfter < 0:
		return nil, invalidOptions("RetryAfter %v is negative", opts.RetryAfter)
	}
	if len(opts.Methods) == 0 {
		opts.Methods = DefaultMethods
	}
	if len(opts.ReplayHeaders) == 0 {
		opts.ReplayHeaders = DefaultReplayHeaders
	}
	opts.Operation = cmp.Or(opts.Operation, DefaultOperation)
	opts.MaxBody = cmp.Or(opts.MaxBody, DefaultMaxBody)
	opts.RetryAfter = cmp.Or(opts.RetryAfter, DefaultRetryAfter)
	opts.Challenge = cmp.Or(opts.Challenge, "Bearer")
	if opts.Classify == nil {
		opts.Classify = DefaultClassify
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	g := &Guard{ic: ic, opts: opts, methods: map[string]bool{}}
	for _, m := range opts.Methods {
		g.methods[strings.ToUpper(m)] = true
	}
	return g, nil
}

// Wrap returns next guarded: requests with a guarded method run next at most once per
// (principal, Idempotency-Key), and every retry gets the recorded answer or a problem that
// says why not (see the package README for each case).
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.methods[strings.ToUpper(r.Method)] {
			next.ServeHTTP(w, r)
			return
		}
		g.serve(w, r, next)
	})
}

// dispatchState is what one request's dispatch did.
type dispatchState struct {
	ran      bool
	panicked any
	rec      *recorder
}

func (g *Guard) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	principal, err := g.opts.Principal(r)
	if err != nil || principal == "" {
		g.refuse(w, err)
		return
	}
	lines := r.Header.Values(KeyHeader)
	if len(lines) == 0 {
		writeProblem(w, Problem{
			Type: ProblemMissingKey, Title: "Idempotency-Key header is missing", Status: http.StatusBadRequest,
			Detail:   fmt.Sprintf("%s %s changes state and requires an Idempotency-Key header", r.Method, r.URL.Path),
			Recovery: `send a unique key per intended operation, e.g. Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324", and reuse it on retries`,
		}, 0)
		return
	}
	key, err := parseKey(lines, !g.opts.RequireQuotedKey)
	if err != nil {
		writeProblem(w, Problem{Type: ProblemInvalidKey, Title: "Idempotency-Key header is malformed", Status: http.StatusBadRequest, Detail: err.Error()}, 0)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.opts.MaxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			writeProblem(w, Problem{Type: ProblemBodyTooLarge, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
				Detail: fmt.Sprintf("guarded requests may carry at most %d bytes", g.opts.MaxBody)}, 0)
			return
		}
		writeProblem(w, Problem{Type: ProblemUnreadableBody, Title: "Request body could not be read", Status: http.StatusBadRequest, Detail: err.Error()}, 0)
		return
	}
	args := fingerprint(r, body)

	run := &dispatchState{rec: newRecorder()}
	ctx := interceptor.WithTask(g.traceContext(context.WithoutCancel(r.Context()), r.Header), principal)
	res, err := g.ic.Do(ctx, interceptor.Call{Operation: g.opts.Operation, Target: key, Args: args},
		func(dctx context.Context, d interceptor.Dispatch) (interceptor.Response, error) {
			return g.dispatch(dctx, d, r, body, next, run)
		})
	g.respond(w, r, res, err, run)
}

// traceContext returns ctx with the trace context of the request headers, when ctx carries
// no span of its own.
func (g *Guard) traceContext(ctx context.Context, h http.Header) context.Context {
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	p := g.opts.Propagator
	if p == nil {
		p = otel.GetTextMapPropagator()
	}
	return p.Extract(ctx, propagation.HeaderCarrier(h))
}

// dispatch runs the handler into the recorder and turns its answer into a Response whose
// body is the stored form of the whole response.
func (g *Guard) dispatch(ctx context.Context, d interceptor.Dispatch, r *http.Request, body []byte, next http.Handler, run *dispatchState) (resp interceptor.Response, err error) {
	run.ran = true
	defer func() {
		if p := recover(); p != nil {
			run.panicked = p
			if p != http.ErrAbortHandler {
				g.opts.Logger.Error("httpguard: handler panicked; outcome unknown", "key", d.Key, "panic", p, "stack", string(debug.Stack()))
			}
			resp, err = interceptor.Response{}, fmt.Errorf("%w: %v", interceptor.ErrToolPanicked, p)
		}
	}()
	r2 := r.WithContext(interceptor.WithDispatch(ctx, d))
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	next.ServeHTTP(run.rec, r2)
	status := run.rec.result()
	return interceptor.Response{
		Status:  status,
		Body:    EncodeResponse(status, storedHeader(run.rec.header, g.opts.ReplayHeaders), run.rec.body.Bytes()),
		Handle:  cmp.Or(run.rec.header.Get("Location"), run.rec.header.Get("Content-Location")),
		Outcome: g.opts.Classify(status),
	}, nil
}

// respond answers the request from what Do returned.
func (g *Guard) respond(w http.ResponseWriter, r *http.Request, res *interceptor.Result, err error, run *dispatchState) {
	if run.panicked != nil {
		if run.panicked == http.ErrAbortHandler {
			panic(http.ErrAbortHandler) // the handler asked to abort the connection; the outcome is recorded
		}
		key := ""
		if v, ok := errors.AsType[*interceptor.Violation](err); ok {
			key = v.Key
		}
		writeProblem(w, Problem{
			Type: ProblemHandlerPanic, Title: "The request failed while it was being processed", Status: http.StatusInternalServerError,
			Detail:   "the handler stopped mid-request, so its effect is unknown; the outcome is being reconciled",
			Residual: key, Recovery: "do not send a new request for this operation; retries with this key answer 409 until the outcome is resolved",
		}, 0)
		return
	}
	switch {
	case err == nil && res.Replayed:
		g.replay(w, res.Output, res.Truncated, res.Key, res.Handle)
		return
	case err == nil, run.ran && errors.Is(err, interceptor.ErrCallFailed):
		run.rec.flush(w)
		return
	}
	v, ok := errors.AsType[*interceptor.Violation](err)
	if !ok {
		status, typ, title := http.StatusInternalServerError, ProblemInternal, "The request could not be guarded"
		if errors.Is(err, interceptor.ErrNotDispatched) {
			status, typ, title = http.StatusServiceUnavailable, ProblemNotDispatched, "The request was not processed"
		}
		if errors.Is(err, interceptor.ErrInvalidCall) {
			// The principal or the key is unusable (e.g. not valid UTF-8): the client's fault.
			g.opts.Logger.Warn("httpguard: request refused", "method", r.Method, "path", r.URL.Path, "err", err)
			writeProblem(w, Problem{Type: ProblemInvalidRequest, Title: "The request cannot be guarded", Status: http.StatusBadRequest,
				Detail: err.Error(), Recovery: "nothing was done; fix the request"}, 0)
			return
		}
		g.opts.Logger.Error("httpguard: request refused", "method", r.Method, "path", r.URL.Path, "err", err)
		writeProblem(w, Problem{Type: typ, Title: title, Status: status, Detail: "nothing was done; retry with the same key"}, 1)
		return
	}
	if run.ran {
		// The handler ran in this request: its own answer is the truth (a 202, a 5xx, or a
		// response whose outcome could not be recorded). Retries see the residual.
		if v.Kind != interceptor.AwaitingUpstream {
			g.opts.Logger.Warn("httpguard: outcome not recorded as settled", "key", v.Key, "kind", v.Kind, "err", v.Cause)
		}
		run.rec.flush(w)
		return
	}
	switch v.Kind {
	case interceptor.PayloadMismatch:
		g.mismatch(w, v)
		return
	case interceptor.MarginTooSmall:
		writeProblem(w, Problem{Type: ProblemNotDispatched, Title: "The request was not processed", Status: http.StatusServiceUnavailable,
			Detail: "too little lease time was left to process it safely; nothing was done", Residual: v.Key, Recovery: "retry with the same key"}, 1)
		return
	}
	// Blocked by an open residual: a different request under the same key is a 422 first.
	if !v.RequestMatches {
		g.mismatch(w, v)
		return
	}
	switch v.Kind {
	case interceptor.InProgress:
		writeProblem(w, Problem{
			Type: ProblemInProgress, Title: "A request with this Idempotency-Key is being processed", Status: http.StatusConflict,
			Detail:   fmt.Sprintf("attempt %d started at %s and has not finished", v.Attempt, v.Since.UTC().Format(time.RFC3339)),
			Residual: v.Key, Recovery: "retry with the same key after Retry-After",
		}, g.retryAfter(v.RetryAfter))
	case interceptor.AwaitingUpstream:
		body := v.Result
		if len(body) == 0 {
			body = EncodeResponse(http.StatusAccepted, http.Header{"Location": {v.Handle}}, nil)
		}
		g.replay(w, body, v.ResultTruncated, v.Key, "")
	default: // UnknownOutcome, LeaseLost
		writeProblem(w, Problem{
			Type: ProblemReconciling, Title: "The outcome of this request is being reconciled", Status: http.StatusConflict,
			Detail: fmt.Sprintf("attempt %d (started %s) ended without a recorded outcome; it may have taken effect",
				v.Attempt, v.Since.UTC().Format(time.RFC3339)),
			Residual: v.Key, Recovery: "do not send a new request for this operation; retry this key after an operator or a probe resolves it",
		}, 0)
	}
}

func (g *Guard) refuse(w http.ResponseWriter, err error) {
	if errors.Is(err, ledger.ErrForbidden) {
		writeProblem(w, Problem{Type: ProblemForbidden, Title: "Forbidden", Status: http.StatusForbidden, Detail: err.Error()}, 0)
		return
	}
	detail := "no principal could be determined from the request"
	if err != nil {
		detail = err.Error()
	}
	w.Header().Set("WWW-Authenticate", g.opts.Challenge)
	writeProblem(w, Problem{Type: ProblemUnauthorized, Title: "Unauthenticated", Status: http.StatusUnauthorized, Detail: detail}, 0)
}

func (g *Guard) mismatch(w http.ResponseWriter, v *interceptor.Violation) {
	writeProblem(w, Problem{
		Type: ProblemKeyReused, Title: "Idempotency-Key reused with another request", Status: http.StatusUnprocessableEntity,
		Detail:   "this key was first used with a different method, path or body",
		Residual: v.Key, Recovery: "use a new key for a new operation; retry the original request unchanged",
	}, 0)
}

// replay writes a stored response with the replay marker. A request settled by a
// reconciler without a recorded response gets 303 See Other to its upstream handle (the
// status resource of an accepted request that has since completed), or 204 without one.
func (g *Guard) replay(w http.ResponseWriter, stored []byte, truncated bool, key, handle string) {
	h := w.Header()
	if truncated {
		writeProblem(w, Problem{
			Type: ProblemNotReplayable, Title: "The recorded response cannot be replayed", Status: http.StatusInternalServerError,
			Detail:   "the request was processed, but its recorded response was cut at the ledger's result cap (interceptor Options.MaxResult)",
			Residual: key, Recovery: "do not resend the operation; fetch the resource it created instead",
		}, 0)
		return
	}
	h.Set(ReplayHeader, "true")
	if len(stored) == 0 { // settled by a reconciler without a result: the effect happened
		if handle != "" {
			h.Set("Location", handle)
			w.WriteHeader(http.StatusSeeOther)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	env, err := decodeResponse(stored)
	if err != nil { // a result stored by a reconciler in its own form
		ct := "application/octet-stream"
		if json.Valid(stored) {
			ct = "application/json"
		}
		h.Set("Content-Type", ct)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(stored)
		return
	}
	for k, vs := range env.Header {
		h[http.CanonicalHeaderKey(k)] = slices.Clone(vs)
	}
	w.WriteHeader(env.Status)
	_, _ = w.Write(env.Body)
}

// retryAfter returns the Retry-After seconds for a request in flight whose lease has left
// remaining: the configured hint, never more than the lease, at least one second.
func (g *Guard) retryAfter(remaining time.Duration) int {
	d := g.opts.RetryAfter
	if remaining > 0 && remaining < d {
		d = remaining
	}
	return max(1, int(math.Ceil(d.Seconds())))
}

// fingerprint returns the request's arguments for the interceptor: method (upper-cased, so
// "post" and "POST" are the same request), path, query and a digest of the body, canonical for JSON bodies (so re-serialised JSON is the same
// request) and of the raw bytes otherwise.
func fingerprint(r *http.Request, body []byte) json.RawMessage {
	b, _ := json.Marshal(struct {
		Method string `json:"method"`
		Path   string `json:"path"`
		Query  string `json:"query,omitempty"`
		Body   string `json:"body"`
	}{strings.ToUpper(r.Method), r.URL.EscapedPath(), r.URL.RawQuery, interceptor.BodyDigest(body, isJSON(r.Header.Get("Content-Type")))})
	return b
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}
