package tools

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
)

// Header names Transport sets on every guarded request.
const (
	// HeaderIdempotencyKey carries the toolfence key, so an upstream that deduplicates
	// requests (and a probe looking the call up later) recognises the call. Transport sends
	// it as an RFC 8941 structured-field string, `"tf1_…"`, as
	// draft-ietf-httpapi-idempotency-key-header defines it (Transport.BareKey sends `tf1_…`).
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderFencingToken carries the attempt's fencing token, so an upstream that stores it
	// can refuse writes carrying an older token.
	HeaderFencingToken = "Toolfence-Fencing-Token"
)

// Exchange is what Transport observed of one request made during a guarded call.
type Exchange struct {
	Method string
	URL    string
	// Status is the HTTP status, 0 when no answer arrived.
	Status int
	// Digest is the hex SHA-256 of the response body as received.
	Digest string
	// Handle is the upstream handle of a 202 answer (see the package doc).
	Handle string
	// Outcome is the classification of the answer.
	Outcome residual.State
	// Err is the transport error, if any.
	Err error
}

// dispatchState is what a guarded call carries in its context: the dispatch, and the
// exchanges Transport saw during it.
type dispatchState struct {
	d interceptor.Dispatch

	mu        sync.Mutex
	exchanges []Exchange
}

func (s *dispatchState) record(e Exchange) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.exchanges = append(s.exchanges, e)
}

// observed combines the exchanges of one call: no exchange gives ok false; equal outcomes
// give that outcome; accepted with succeeded gives accepted; any other mix is unknown (part
// of the call may have had an effect). Status and handle come from the last exchange with the
// combined outcome, or the last exchange.
func (s *dispatchState) observed() (Exchange, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.exchanges) == 0 {
		return Exchange{}, false
	}
	out := s.exchanges[0].Outcome
	for _, e := range s.exchanges[1:] {
		switch {
		case e.Outcome == out:
		case out == residual.Accepted && e.Outcome == residual.Succeeded,
			out == residual.Succeeded && e.Outcome == residual.Accepted:
			out = residual.Accepted
		default:
			out = residual.Unknown
		}
	}
	pick := s.exchanges[len(s.exchanges)-1]
	for _, e := range s.exchanges {
		if e.Outcome == out {
			pick = e
		}
	}
	pick.Outcome = out
	return pick, true
}

type stateKey struct{}

// WithDispatch returns a context carrying d (interceptor.WithDispatch) and a record of the
// exchanges Transport makes under it, which Guard commits as the call's outcome. Guarded
// tools get it from Guard. Inside any other guarded call (interceptor.Do, httpguard,
// consumer) the context already carries the dispatch: Transport sends its key, and the
// caller's own classification decides the outcome.
func WithDispatch(ctx context.Context, d interceptor.Dispatch) context.Context {
	return context.WithValue(interceptor.WithDispatch(ctx, d), stateKey{}, &dispatchState{d: d})
}

func stateFrom(ctx context.Context) *dispatchState {
	s, _ := ctx.Value(stateKey{}).(*dispatchState)
	return s
}

// Transport is an http.RoundTripper for tools that call HTTP APIs. On each request made in a
// guarded call it sets Idempotency-Key to the call's key, quoted as the IETF draft asks
// (`"tf1_…"`), and Toolfence-Fencing-Token to its token (replacing any values the request had), reads the answer whole, and records its
// status, body digest, handle and classification (see the package doc) for the guarded call
// to commit. Only requests with side effects count toward the call's outcome: GET, HEAD,
// OPTIONS and TRACE carry the headers but a 404 on a lookup says nothing about the effect.
// The zero value is ready to use; it is safe for concurrent use.
type Transport struct {
	// Base performs the requests. Defaults to http.DefaultTransport.
	Base http.RoundTripper
	// Overrides replaces the classification of single status codes (for example
	// 409: residual.Failed for an API whose 409 proves nothing was done). Values must be
	// Succeeded, Accepted, Failed or Unknown; a 202 is never recorded as Succeeded.
	Overrides map[int]residual.State
	// AllowUnguarded lets requests with side effects through without a dispatch in their
	// context (they carry no key). By default such requests fail with interceptor.ErrNoDispatch.
	AllowUnguarded bool
	// Observe, when set, is called with every exchange (for logs and audits).
	Observe func(Exchange)
	// BareKey sends the key without the structured-field quotes (Idempotency-Key: tf1_…),
	// for an upstream that refuses a quoted key or keeps the quotes as part of the key when a
	// probe looks it up. Defaults to false: the key is sent quoted, which httpguard and every
	// server following the draft read as the bare key.
	BareKey bool
	// Propagator writes the trace context of the request's context into its headers (W3C
	// traceparent and tracestate with propagation.TraceContext), so the upstream's spans
	// join the guarded call's trace. Defaults to otel.GetTextMapPropagator(), the program's
	// global propagator (a no-op until the program sets one; toolfence serve sets W3C trace
	// context and baggage).
	Propagator propagation.TextMapPropagator
}

// RoundTrip sends req with the key and token headers and the trace context of its context
// (see Propagator), and records the exchange; req itself is never modified. It returns
// the response with its body fully read and replaced by an in-memory copy, or the base
// transport's error (recorded as an unknown outcome), or, without sending anything, an error
// wrapping both interceptor.ErrNoDispatch and interceptor.ErrNoEffect.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	st := stateFrom(req.Context())
	d, guarded := interceptor.DispatchFrom(req.Context())
	if !guarded && !t.AllowUnguarded && !safeMethod(req.Method) {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, interceptor.NoEffect(fmt.Errorf("%w: %s %s: build the request from the context the tool was given "+
			"(http.NewRequestWithContext(ctx, …) with the tool's ctx; Interceptor.Do gives every ToolFunc such a context)",
			interceptor.ErrNoDispatch, req.Method, req.URL.Redacted()))
	}
	cloned := false
	if guarded {
		req, cloned = req.Clone(req.Context()), true
		req.Header.Set(HeaderIdempotencyKey, t.keyValue(d.Key))
		req.Header.Set(HeaderFencingToken, strconv.FormatUint(d.Token, 10))
	}
	req = t.injectTrace(req, cloned)
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	ex := Exchange{Method: req.Method, URL: req.URL.Redacted()}
	resp, err := base.RoundTrip(req)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if err != nil {
			err = fmt.Errorf("tools: reading the answer of %s %s: %w", req.Method, ex.URL, err)
		}
	}
	if resp != nil {
		ex.Status = resp.StatusCode
		sum := sha256.Sum256(body)
		ex.Digest = hex.EncodeToString(sum[:])
	}
	ex.Err = err
	if err != nil {
		ex.Outcome = residual.Unknown
	} else {
		ex.Outcome = t.classify(resp.StatusCode)
		if resp.StatusCode == http.StatusAccepted {
			ex.Handle = acceptedHandle(resp, body)
		}
	}
	if st != nil && !safeMethod(req.Method) {
		st.record(ex)
	}
	if t.Observe != nil {
		t.Observe(ex)
	}
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// injectTrace returns req with the trace context of its context in its headers, cloning
// it first unless cloned says it is already a copy.
func (t *Transport) injectTrace(req *http.Request, cloned bool) *http.Request {
	p := t.Propagator
	if p == nil {
		p = otel.GetTextMapPropagator()
	}
	fields := propagation.HeaderCarrier{}
	p.Inject(req.Context(), fields)
	if len(fields) == 0 {
		return req
	}
	if !cloned {
		req = req.Clone(req.Context())
	}
	for k, v := range fields {
		req.Header[k] = v
	}
	return req
}

// keyValue is the Idempotency-Key field value for key: an RFC 8941 sf-string (only '"' and
// '\' are escaped; a toolfence key has neither), or the key as is with BareKey.
func (t *Transport) keyValue(key string) string {
	if t.BareKey {
		return key
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

func (t *Transport) classify(status int) residual.State {
	out := interceptor.StatusOutcome(status)
	if o, ok := t.Overrides[status]; ok {
		switch o {
		case residual.Succeeded, residual.Accepted, residual.Failed, residual.Unknown:
			out = o
		default:
			out = residual.Unknown
		}
	}
	if status == http.StatusAccepted && out == residual.Succeeded {
		out = residual.Accepted
	}
	return out
}

func safeMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// acceptedHandle returns where to poll an accepted call: the Location header (resolved
// against the request URL), else the JSON body's status_url, job_id or id.
func acceptedHandle(resp *http.Response, body []byte) string {
	if loc := resp.Header.Get("Location"); loc != "" {
		if u, err := resp.Location(); err == nil {
			return u.String()
		}
		return loc
	}
	var fields map[string]any
	if json.Unmarshal(body, &fields) == nil {
		for _, k := range []string{"status_url", "job_id", "id"} {
			switch v := fields[k].(type) {
			case string:
				if v != "" {
					return v
				}
			case float64:
				return strconv.FormatFloat(v, 'f', -1, 64)
			}
		}
	}
	return ""
}

// ErrUpstreamStatus is wrapped by FromHTTP's error for statuses that leave the outcome
// unknown (408, 409, 425, 429, 5xx and the like).
var ErrUpstreamStatus = errors.New("tools: upstream answered with an ambiguous status")

// FromHTTP turns the result of an HTTP call into what an interceptor.ToolFunc returns, so a
// tool author writes one line: `return tools.FromHTTP(client.Do(req))`. It reads and closes
// the body and classifies the status by interceptor.StatusOutcome: a success gives the body with a nil
// error; 202 gives an accepted Response with the handle; 400, 401, 403, 404 and 422 give an
// error wrapping interceptor.ErrNoEffect (the attempt is recorded as failed); other statuses
// give an error wrapping ErrUpstreamStatus, and a transport error or a broken body is
// returned as is (both unknown outcomes).
func FromHTTP(resp *http.Response, err error) (interceptor.Response, error) {
	if err != nil {
		return interceptor.Response{}, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	out := interceptor.Response{Body: body, Status: resp.StatusCode, Outcome: interceptor.StatusOutcome(resp.StatusCode)}
	if err != nil {
		out.Outcome = residual.Unknown
		return out, fmt.Errorf("tools: reading the answer (status %d): %w", resp.StatusCode, err)
	}
	switch out.Outcome {
	case residual.Accepted:
		out.Handle = acceptedHandle(resp, body)
		return out, nil
	case residual.Failed:
		return out, interceptor.NoEffect(fmt.Errorf("upstream answered %s: %s", resp.Status, snippet(body)))
	case residual.Unknown:
		return out, fmt.Errorf("%w: %s: %s", ErrUpstreamStatus, resp.Status, snippet(body))
	}
	return out, nil
}

// snippet returns up to 200 bytes of body for error texts.
func snippet(body []byte) string {
	const n = 200
	if len(body) > n {
		return string(body[:n]) + "…"
	}
	return string(body)
}
