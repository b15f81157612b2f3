package remote

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/toolfence/toolfence/internal/httpserve"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// Access is what one request may touch.
type Access struct {
	// All grants every namespace (and the calls that span them: GC and Watch without a
	// namespace, OpenResiduals).
	All bool
	// Namespace is the one namespace of a bound request (when All is false).
	Namespace string
	// Principal names who is asking, for the bounds of HandlerOptions (requests in flight,
	// watch streams): each principal has its own count. GrantedTokens names a token by its
	// digest. Empty is one principal like any other.
	Principal string
	// UpstreamIdempotent reports, for a bound request, whether an operation is declared
	// upstream-idempotent by the server: only then may its reserve re-dispatch over an
	// unknown outcome (ledger.ReserveParams.Redispatch). Nil declares none. Requests with
	// All keep the Redispatch they send.
	UpstreamIdempotent func(operation string) bool
}

// Authorizer decides the Access of a request, or returns an error when the request may do
// nothing: answered 403 when the error wraps ErrNotGranted (a known principal without the
// grant), 401 otherwise; its text is in the message.
type Authorizer func(r *http.Request) (Access, error)

// AllNamespaces grants every request access to every namespace: for a listener only the
// store's user can reach (a unix socket of mode 0600).
func AllNamespaces() Authorizer {
	return func(*http.Request) (Access, error) { return Access{All: true}, nil }
}

// BearerTokens binds each request to the namespace of its "Authorization: Bearer TOKEN"
// header, as namespace(TOKEN) says; a request without a known token is refused (401).
func BearerTokens(namespace func(token string) (string, bool)) Authorizer {
	return func(r *http.Request) (Access, error) {
		tok := bearer(r)
		if tok == "" {
			return Access{}, errors.New("no bearer token: send \"Authorization: Bearer TOKEN\"")
		}
		ns, ok := namespace(tok)
		if !ok {
			return Access{}, errors.New("the bearer token is not known to this server")
		}
		return Access{Namespace: ns}, nil
	}
}

// GrantedTokens binds each request to the namespace of its bearer token, as lookup(TOKEN)
// says, when lookup grants that token the ledger protocol; a request without a known token
// is refused (401), one whose token is known but not granted (an MCP agent's token) gets
// 403 and ErrNotGranted. idempotent declares the operations whose reserves may re-dispatch over an unknown
// outcome (Access.UpstreamIdempotent); nil declares none.
func GrantedTokens(lookup func(token string) (namespace string, known, granted bool), idempotent func(operation string) bool) Authorizer {
	return func(r *http.Request) (Access, error) {
		tok := bearer(r)
		if tok == "" {
			return Access{}, errors.New("no bearer token: send \"Authorization: Bearer TOKEN\"")
		}
		ns, known, granted := lookup(tok)
		switch {
		case !known:
			return Access{}, errors.New("the bearer token is not known to this server")
		case !granted:
			return Access{}, fmt.Errorf("%w: it serves MCP only; a token for --store http://… needs the grant "+
				"\"ledger\" in the server's token file (TOKEN NAMESPACE ledger)", ErrNotGranted)
		}
		sum := sha256.Sum256([]byte(tok))
		return Access{Namespace: ns, Principal: hex.EncodeToString(sum[:8]), UpstreamIdempotent: idempotent}, nil
	}
}

// bearer returns the token of r's Authorization header, or "".
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// StaticToken is an Authorizer for one token bound to one namespace (tests, one tenant).
func StaticToken(token, namespace string) Authorizer {
	return BearerTokens(func(t string) (string, bool) {
		return namespace, subtle.ConstantTimeCompare([]byte(t), []byte(token)) == 1
	})
}

// HandlerOptions configure Handler.
type HandlerOptions struct {
	// Authorize decides each request's access. Required: without it every request is
	// refused (401).
	Authorize Authorizer
	// MaxBody caps a request body in bytes; larger ones get 413. Defaults to 16 MiB.
	MaxBody int64
	// MaxInFlight caps the steps one principal (Access.Principal) has in progress at once,
	// and MaxInFlightTotal those of all principals; a step past either is refused with 429,
	// Retry-After and an error wrapping ErrBusy, and does not run. Zero leaves them
	// unbounded (the owner's socket: the store's own user).
	MaxInFlight, MaxInFlightTotal int
	// MaxWatches caps the watch streams one principal holds open, and MaxWatchesTotal those
	// of all principals (keep it below the server's connection cap, so that streams never
	// take every connection); more get 429 and ErrBusy. Zero leaves them unbounded.
	MaxWatches, MaxWatchesTotal int
	// StepTimeout bounds one step of the ledger. A mutating step runs to its end (or this
	// timeout) even when its client goes away, so that what it did is decided by the
	// backend and not by a cancelled context. Defaults to 30 seconds.
	StepTimeout time.Duration
}

// DefaultMaxBody and DefaultStepTimeout are the defaults of HandlerOptions. The largest
// step the ledger takes (a result of ledger.MaxResult, base64 in JSON, with its texts) fits
// in DefaultMaxBody.
const (
	DefaultMaxBody     = 4 << 20
	DefaultStepTimeout = 30 * time.Second
)

// Handler serves l over the protocol of this package (see the package doc) at any path
// whose last element is a method name; mount it under Path. It is safe for concurrent use.
// It never runs a step it refused: 400, 401, 403, 404, 405, 413, 415 and 503 answers mean
// the ledger was not called. Whatever Authorize says, it refuses what a web page can make a
// browser send (httpserve.CheckBrowser): a request with an Origin that is not loopback
// (403) and a POST whose Content-Type is not application/json (415), so that a page the
// user visits cannot drive a ledger served without tokens on loopback.
func Handler(l ledger.Ledger, opts HandlerOptions) http.Handler {
	opts.MaxBody = cmp.Or(opts.MaxBody, DefaultMaxBody)
	opts.StepTimeout = cmp.Or(opts.StepTimeout, DefaultStepTimeout)
	return &handler{l: l, opts: opts}
}

type handler struct {
	l    ledger.Ledger
	opts HandlerOptions
	// steps and watches count what each principal has in progress.
	steps, watches httpserve.InFlight
}

// take takes a slot of f for principal under the bounds max (per principal) and total
// (every principal); zero bounds nothing. It returns the release, or "" and the phrase of
// the full bound.
func take(f *httpserve.InFlight, principal string, max, total int) (release func(), full string) {
	if max <= 0 && total <= 0 {
		return func() {}, ""
	}
	if full := f.Acquire(principal, cmp.Or(max, math.MaxInt), cmp.Or(total, math.MaxInt)); full != "" {
		return nil, full
	}
	return func() { f.Release(principal) }, ""
}

// busyRetry is the Retry-After of a step refused for the in-flight bounds.
const busyRetry = time.Second

// refusal is an answer that is not the backend's: the step did not run.
type refusal struct {
	status int
	err    error
	msg    string
}

func refuse(status int, sentinel error, format string, args ...any) *refusal {
	return &refusal{status: status, err: sentinel, msg: fmt.Sprintf(format, args...)}
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	method := path.Base(r.URL.Path)
	if rf := h.serve(w, r, method); rf != nil {
		if rf.status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", strconv.Itoa(int(busyRetry.Seconds())))
		}
		writeJSON(w, rf.status, envelope{Error: &wireError{Message: rf.msg, Codes: toWire(rf.err).Codes}})
	}
}

func (h *handler) serve(w http.ResponseWriter, r *http.Request, method string) *refusal {
	step, ok := steps[method]
	if !ok && method != "watch" {
		return refuse(http.StatusNotFound, ErrProtocol, "no ledger method %q (want one of reserve, commit, renew, resolve, evidence, get, list, gc, open, watch)", method)
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return refuse(http.StatusMethodNotAllowed, ErrProtocol, "%s: use POST, not %s", method, r.Method)
	}
	if h.opts.Authorize == nil {
		return refuse(http.StatusUnauthorized, ledger.ErrUnauthorized, "this server has no authorizer: it serves nobody")
	}
	acc, err := h.opts.Authorize(r)
	if errors.Is(err, ErrNotGranted) {
		return refuse(http.StatusForbidden, ErrNotGranted, "%s: %v", method, err)
	}
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="toolfence"`)
		return refuse(http.StatusUnauthorized, ledger.ErrUnauthorized, "%s: %v", method, err)
	}
	if method == "watch" {
		release, _ := take(&h.watches, acc.Principal, h.opts.MaxWatches, h.opts.MaxWatchesTotal)
		if release == nil {
			return refuse(http.StatusTooManyRequests, ErrBusy, "watch: too many watch streams open (at most %d per token, %d in all): "+
				"close one, or watch again later", h.opts.MaxWatches, h.opts.MaxWatchesTotal)
		}
		defer release()
	} else {
		release, full := take(&h.steps, acc.Principal, h.opts.MaxInFlight, h.opts.MaxInFlightTotal)
		if release == nil {
			return refuse(http.StatusTooManyRequests, ErrBusy, "%s: %s: the step did not run; retry after %v", method, full, busyRetry)
		}
		defer release()
	}
	switch status, why := httpserve.CheckBrowser(r); status {
	case 0:
	case http.StatusForbidden:
		return refuse(status, ledger.ErrForbidden, "%s: %v", method, why)
	default:
		return refuse(status, ErrProtocol, "%s: %v", method, why)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return refuse(http.StatusRequestEntityTooLarge, ErrProtocol, "%s: request body exceeds %d bytes", method, h.opts.MaxBody)
	case err != nil:
		return refuse(http.StatusBadRequest, ErrProtocol, "%s: reading the request body: %v", method, err)
	}
	if method == "watch" {
		return h.watch(w, r, acc, body)
	}
	in, ns, err := step.decode(body)
	if err != nil {
		return refuse(http.StatusBadRequest, ErrProtocol, "%s: %v", method, err)
	}
	if rf := allowed(method, acc, ns, step.spans); rf != nil {
		return rf
	}
	if rf := fenced(method, acc, in); rf != nil {
		return rf
	}
	ctx := r.Context()
	if step.mutating {
		ctx = context.WithoutCancel(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, h.opts.StepTimeout)
	defer cancel()
	out, err := step.run(ctx, h.l, in)
	if errors.Is(err, lease.ErrClosed) {
		return refuse(http.StatusServiceUnavailable, ledger.ErrUnavailable, "%s: the server's ledger is closed: %v", method, err)
	}
	env := envelope{Result: out}
	if err != nil {
		env.Error = toWire(err)
	}
	writeJSON(w, http.StatusOK, env)
	return nil
}

// allowed checks that acc covers namespace ns ("" with spans: every namespace).
func allowed(method string, acc Access, ns string, spans bool) *refusal {
	switch {
	case acc.All:
		return nil
	case ns == "" && spans:
		return refuse(http.StatusForbidden, ledger.ErrForbidden, "%s of every namespace: this request is bound to namespace %q; name it", method, acc.Namespace)
	case ns == "" && method == "open":
		return refuse(http.StatusForbidden, ledger.ErrForbidden, "open: counting open residuals spans every namespace; this request is bound to namespace %q", acc.Namespace)
	case ns != acc.Namespace:
		return refuse(http.StatusForbidden, ledger.ErrForbidden, "%s: this request is bound to namespace %q and may not use namespace %q", method, acc.Namespace, ns)
	}
	return nil
}

// fenced keeps, for a request bound to a namespace, the rules the other surfaces keep: a
// reserve, commit or renew must carry a proof, and its holder is qualified by it (proof.go),
// so that only the client that reserved an attempt can commit or renew it; and a reserve
// re-dispatches over an unknown outcome only for an operation the server declares
// upstream-idempotent (for any other, Redispatch is dropped and the ledger answers the
// unknown outcome). Supersede is kept: a new intent over a settled success is a new attempt
// like a new task's, which a bound request may start anyway, and it never passes an outcome
// that may have happened (ledger.ReserveParams.Supersede). Requests with every namespace
// (the store's own user, on its socket) are trusted as the store itself.
func fenced(method string, acc Access, in any) *refusal {
	if acc.All {
		return nil
	}
	var holder *string
	var proof string
	switch p := in.(type) {
	case *reserveRequest:
		if p.Redispatch && (acc.UpstreamIdempotent == nil || !acc.UpstreamIdempotent(p.Operation)) {
			p.Redispatch = false
		}
		holder, proof = &p.Holder, p.Proof
	case *commitRequest:
		holder, proof = &p.Holder, p.Proof
	case *renewRequest:
		holder, proof = &p.Holder, p.Proof
	default:
		return nil
	}
	if !validProof(proof) {
		return refuse(http.StatusForbidden, ErrNotHolder, "%s: the request carries no proof of holding (Proof: the %d lowercase hex digits "+
			"of the client's secret); a remote.Client sends it", method, 2*proofSecretBytes)
	}
	if *holder != "" {
		*holder += proofSuffix(proof)
	}
	return nil
}

// step is one method: how to decode its parameters and run it.
type step struct {
	mutating bool
	// spans: an empty namespace means every namespace (GC).
	spans  bool
	decode func([]byte) (in any, namespace string, err error)
	run    func(ctx context.Context, l ledger.Ledger, in any) (any, error)
}

// decodeStrict decodes exactly one JSON value into v, refusing unknown fields.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed parameters: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("malformed parameters: more than one JSON value in the body")
	}
	return nil
}

// keyed builds the step of a method whose parameters P name a namespace.
func keyed[P any, R any](mutating, spans bool, ns func(*P) string, run func(ledger.Ledger, context.Context, P) (R, error)) step {
	return step{
		mutating: mutating, spans: spans,
		decode: func(body []byte) (any, string, error) {
			p := new(P)
			if err := decodeStrict(body, p); err != nil {
				return nil, "", err
			}
			return p, ns(p), nil
		},
		run: func(ctx context.Context, l ledger.Ledger, in any) (any, error) {
			out, err := run(l, ctx, *in.(*P))
			return out, err
		},
	}
}

// openParams are the (empty) parameters of open.
type openParams struct{}

// watchParams are the parameters of watch.
type watchParams struct {
	// Namespace to watch; empty watches every namespace.
	Namespace string
}

var steps = map[string]step{
	"reserve": keyed(true, false, func(p *reserveRequest) string { return p.Namespace },
		func(l ledger.Ledger, ctx context.Context, p reserveRequest) (*ledger.ReserveResult, error) {
			return l.Reserve(ctx, p.ReserveParams)
		}),
	"commit": keyed(true, false, func(p *commitRequest) string { return p.Namespace },
		func(l ledger.Ledger, ctx context.Context, p commitRequest) (*residual.Residual, error) {
			return l.Commit(ctx, p.CommitParams)
		}),
	"renew": keyed(true, false, func(p *renewRequest) string { return p.Namespace },
		func(l ledger.Ledger, ctx context.Context, p renewRequest) (lease.Lease, error) {
			return l.Renew(ctx, p.RenewParams)
		}),
	"resolve": keyed(true, false, func(p *ledger.ResolveParams) string { return p.Namespace }, ledger.Ledger.Resolve),
	"evidence": keyed(true, false, func(p *ledger.EvidenceParams) string { return p.Namespace },
		ledger.Ledger.AppendEvidence),
	"get":  keyed(false, false, func(p *ledger.GetParams) string { return p.Namespace }, ledger.Ledger.Get),
	"list": keyed(false, false, func(p *ledger.ListParams) string { return p.Namespace }, ledger.Ledger.List),
	"gc":   keyed(true, true, func(p *ledger.GCParams) string { return p.Namespace }, ledger.Ledger.GC),
	"open": keyed(false, false, func(*openParams) string { return "" },
		func(l ledger.Ledger, ctx context.Context, _ openParams) ([]ledger.OpenCount, error) {
			oc, ok := l.(ledger.OpenCounter)
			if !ok {
				return nil, fmt.Errorf("%w: open: the server's ledger does not count open residuals", ErrProtocol)
			}
			return oc.OpenResiduals(ctx)
		}),
}

// watch streams the changes of one namespace (or all) as JSON lines until the client goes
// away or the ledger ends the stream.
func (h *handler) watch(w http.ResponseWriter, r *http.Request, acc Access, body []byte) *refusal {
	var p watchParams
	if err := decodeStrict(body, &p); err != nil {
		return refuse(http.StatusBadRequest, ErrProtocol, "watch: %v", err)
	}
	if rf := allowed("watch", acc, p.Namespace, true); rf != nil {
		return rf
	}
	wt, ok := h.l.(ledger.Watcher)
	if !ok {
		return refuse(http.StatusNotImplemented, ErrProtocol, "watch: the server's ledger does not stream changes")
	}
	ch, err := wt.Watch(r.Context(), p.Namespace)
	if errors.Is(err, lease.ErrClosed) {
		return refuse(http.StatusServiceUnavailable, ledger.ErrUnavailable, "watch: the server's ledger is closed: %v", err)
	}
	if err != nil {
		writeJSON(w, http.StatusOK, envelope{Error: toWire(err)})
		return nil
	}
	// A stream may outlive a server's read timeout: lift it for this request.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for c := range ch {
		if enc.Encode(c) != nil || bw.Flush() != nil || rc.Flush() != nil {
			// The client is gone; r.Context() ends, and the ledger closes ch.
			for range ch {
			}
			break
		}
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
