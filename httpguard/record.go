package httpguard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// recorder buffers a handler's response so it can be classified and stored before any byte
// reaches the client. Streaming (Flush, Hijack) is not supported: a guarded response is
// one unit that is either recorded or not.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status != 0 || status < 200 { // ignore repeats and informational (1xx) answers
		return
	}
	r.status = status
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}

// result returns the status, defaulting to 200 when the handler wrote nothing.
func (r *recorder) result() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

// flush copies the recorded response to w: every header the handler set, the status and
// the body.
func (r *recorder) flush(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range r.header {
		h[k] = append([]string(nil), v...)
	}
	w.WriteHeader(r.result())
	_, _ = w.Write(r.body.Bytes())
}

// envelope is the stored form of a response: what a replay writes back byte for byte.
type envelope struct {
	V      int         `json:"v"`
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body"`
}

const envelopeVersion = 1

// EncodeResponse returns the stored form of a response: the bytes the guard caches as the
// result of a request. A probe or an operator that settles a residual of this guard as
// succeeded passes it as the result, so retries replay that response. It never fails.
func EncodeResponse(status int, header http.Header, body []byte) []byte {
	b, _ := json.Marshal(envelope{V: envelopeVersion, Status: status, Header: header, Body: body})
	return b
}

// errNotEnvelope says a stored result is not in the guard's stored form.
var errNotEnvelope = errors.New("httpguard: stored result is not a recorded response")

// decodeResponse parses a stored result. It returns an error wrapping errNotEnvelope for
// bytes that EncodeResponse did not produce.
func decodeResponse(b []byte) (*envelope, error) {
	var e envelope
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("%w: %w", errNotEnvelope, err)
	}
	if e.V != envelopeVersion || e.Status < 200 || e.Status > 999 {
		return nil, fmt.Errorf("%w: version %d, status %d", errNotEnvelope, e.V, e.Status)
	}
	return &e, nil
}

// storedHeader returns the headers of h that may be stored and replayed.
func storedHeader(h http.Header, allowed []string) http.Header {
	out := http.Header{}
	for _, name := range allowed {
		if v := h.Values(name); len(v) > 0 {
			out[http.CanonicalHeaderKey(name)] = append([]string(nil), v...)
		}
	}
	return out
}
