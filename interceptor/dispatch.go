package interceptor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"

	"github.com/toolfence/toolfence/residual"
)

// ErrNoDispatch is wrapped by the error of tools.Transport (and of any transport that needs a dispatch) for a request with a side effect (any method
// but GET, HEAD, OPTIONS and TRACE) whose context carries no dispatch: it was made outside a
// guarded call, or inside one but built from another context than the one the tool was given
// (http.NewRequest, context.Background()). Nothing was sent, so the error also wraps
// ErrNoEffect: a guarded call that returns it is recorded as failed (not
// dispatched), never as an unknown outcome that would lock the key.
var ErrNoDispatch = errors.New("interceptor: no dispatch in the request context: the request was not sent")

type dispatchKey struct{}

// WithDispatch returns a context carrying d. Do gives every ToolFunc such a context, so
// code anywhere below a guarded call (an HTTP transport, a handler behind httpguard, a
// consumer's handler) finds the key and fencing token with DispatchFrom.
func WithDispatch(ctx context.Context, d Dispatch) context.Context {
	return context.WithValue(ctx, dispatchKey{}, d)
}

// DispatchFrom returns the dispatch of the guarded call ctx belongs to (its key, fencing
// token and attempt), and false outside a guarded call.
func DispatchFrom(ctx context.Context) (Dispatch, bool) {
	d, ok := ctx.Value(dispatchKey{}).(Dispatch)
	return d, ok
}

// StatusOutcome is the outcome an HTTP status from a remote upstream proves: 202 →
// Accepted (never a success); other 2xx → Succeeded; 400, 401, 403, 404, 422 → Failed (the
// request was refused before any effect); every other status (408, 409, 425, 429, 5xx, 3xx,
// 1xx) → Unknown. DefaultClassifier and tools.Transport use it.
func StatusOutcome(status int) residual.State {
	switch {
	case status == http.StatusAccepted:
		return residual.Accepted
	case status >= 200 && status < 300:
		return residual.Succeeded
	}
	switch status {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound,
		http.StatusUnprocessableEntity:
		return residual.Failed
	}
	return residual.Unknown
}

// BodyDigest fingerprints a request or message body for a call's arguments: "json:" and
// the canonical digest when asJSON and the body is valid JSON (so re-serialised JSON is the
// same request), else "raw:" and the SHA-256 of the bytes.
func BodyDigest(body []byte, asJSON bool) string {
	if asJSON {
		if d, err := residual.Digest(body); err == nil {
			return "json:" + d
		}
	}
	sum := sha256.Sum256(body)
	return "raw:" + hex.EncodeToString(sum[:])
}
