package httpguard_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/httpguard"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

func TestNewRejectsBadOptions(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, err := httpguard.New(nil, httpguard.Options{Principal: bearer})
	require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
	_, err = httpguard.New(f.ic, httpguard.Options{})
	require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
	_, err = httpguard.New(f.ic, httpguard.Options{Principal: bearer, MaxBody: -1})
	require.ErrorIs(t, err, interceptor.ErrInvalidOptions)
}

// Draft: a guarded request without the header gets 400 with a problem body.
func TestMissingKeyIs400(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, f *fixture, tr transport) {
		for _, q := range []req{post("/charges", "", `{"amount":1}`), {method: http.MethodPatch, path: "/charges/ch_1", principal: "alice"}} {
			r := tr.send(t, q)
			require.Equal(t, http.StatusBadRequest, r.status)
			p := r.problem(t)
			require.Equal(t, httpguard.ProblemMissingKey, p.Type)
			require.Contains(t, p.Detail, "requires an Idempotency-Key")
		}
		require.Zero(t, f.api.charges.Load(), "the handler never ran")
	})
}

// The key is a structured-field string; anything else is a 400 that says what is wrong.
func TestMalformedKeyIs400(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, f *fixture, tr transport) {
		for _, tc := range []struct {
			name, key string
			extra     []string
			detail    string
		}{
			{"bare key with a space", `8e03978e 40d5`, nil, "neither a structured-field string nor a bare key"},
			{"bare key with a comma", `a,b`, nil, "neither a structured-field string nor a bare key"},
			{"empty string", `""`, nil, "empty string"},
			{"unterminated", `"abc`, nil, "no closing quote"},
			{"bad escape", `"a\nb"`, nil, "may be escaped"},
			{"two items", `"a", "b"`, nil, "after the string"},
			{"twice", `"a"`, []string{`"b"`}, "appears 2 times"},
			{"too long", `"` + strings.Repeat("k", httpguard.MaxKeyLength+1) + `"`, nil, "the limit is 255"},
		} {
			q := post("/charges", tc.key, `{"amount":1}`)
			q.extraKeys = tc.extra
			r := tr.send(t, q)
			require.Equal(t, http.StatusBadRequest, r.status, tc.name)
			p := r.problem(t)
			require.Equal(t, httpguard.ProblemInvalidKey, p.Type, tc.name)
			require.Contains(t, p.Detail, tc.detail, tc.name)
		}
		require.Zero(t, f.api.charges.Load())
	})
}

// By default a bare key (as most APIs and their clients send it) is accepted, and is the same
// key as its quoted form.
func TestUnquotedKeyByDefault(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tr := f.transports()["httptest"]
	first := tr.send(t, post("/charges", `8e03978e-40d5-43e8-bc93-6894a57f9324`, `{"amount":1}`))
	require.Equal(t, http.StatusCreated, first.status)
	again := tr.send(t, post("/charges", keyA, `{"amount":1}`))
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get(httpguard.ReplayHeader), "the quoted and bare forms are one key")
	require.EqualValues(t, 1, f.api.charges.Load())
}

// RequireQuotedKey refuses a bare key with a 400 that says how to quote it.
func TestUnquotedKeyWhenStrict(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOpts) { o.guard = func(g *httpguard.Options) { g.RequireQuotedKey = true } })
	tr := f.transports()["httptest"]
	r := tr.send(t, post("/charges", `8e03978e-40d5-43e8-bc93-6894a57f9324`, `{"amount":1}`))
	require.Equal(t, http.StatusBadRequest, r.status)
	p := r.problem(t)
	require.Equal(t, httpguard.ProblemInvalidKey, p.Type)
	require.Contains(t, p.Detail, `not a structured-field string; quote it, e.g. Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`)
	require.Equal(t, http.StatusCreated, tr.send(t, post("/charges", keyA, `{"amount":1}`)).status)
	require.EqualValues(t, 1, f.api.charges.Load())
}

// Draft: a completed request is replayed: the stored status, the allowed headers and the
// body byte for byte, marked as a replay, without running the handler.
func TestCompletedRequestIsReplayed(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, f *fixture, tr transport) {
		first := tr.send(t, post("/charges", keyA, `{"amount":1200,"currency":"eur"}`))
		require.Equal(t, http.StatusCreated, first.status)
		require.Equal(t, `{"charge":"ch_1","amount":1200}`, string(first.body))
		require.Empty(t, first.header.Get(httpguard.ReplayHeader))
		require.Equal(t, "session=secret", first.header.Get("Set-Cookie"), "the first response carries every header")

		// The same intent, re-serialised JSON: still the same request.
		again := tr.send(t, post("/charges", keyA, `{ "currency": "eur", "amount": 1200.0 }`))
		require.Equal(t, http.StatusCreated, again.status)
		require.Equal(t, first.body, again.body, "byte for byte")
		require.Equal(t, "true", again.header.Get(httpguard.ReplayHeader))
		require.Equal(t, "/charges/ch_1", again.header.Get("Location"))
		require.Equal(t, "application/json", again.header.Get("Content-Type"))
		require.Empty(t, again.header.Get("Set-Cookie"), "only allowed headers are stored")
		require.Empty(t, again.header.Get("X-Request-Token"))
		require.EqualValues(t, 1, f.api.charges.Load())

		r := f.residualOf("alice", keyA)
		require.Equal(t, residual.Succeeded, r.State)
		require.Equal(t, "tenant:alice", r.Task, "the task is the principal")
	})
}

// Draft: the same key with another request (body, path or method) gets 422, whether the
// first one completed or is still open.
func TestKeyReuseWithAnotherRequestIs422(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, f *fixture, tr transport) {
		require.Equal(t, http.StatusCreated, tr.send(t, post("/charges", keyA, `{"amount":1200}`)).status)
		for _, q := range []req{
			post("/charges", keyA, `{"amount":1300}`),
			post("/charges?expand=customer", keyA, `{"amount":1200}`),
			post("/jobs", keyA, `{"amount":1200}`),
			{method: http.MethodPatch, path: "/charges", key: keyA, body: `{"amount":1200}`, principal: "alice", contentType: "application/json"},
		} {
			r := tr.send(t, q)
			require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s %s %s", q.method, q.path, q.body)
			require.Equal(t, httpguard.ProblemKeyReused, r.problem(t).Type)
		}
		// An open (accepted) residual refuses other requests the same way.
		require.Equal(t, http.StatusAccepted, tr.send(t, post("/jobs", keyB, `{"n":1}`)).status)
		r := tr.send(t, post("/jobs", keyB, `{"n":2}`))
		require.Equal(t, http.StatusUnprocessableEntity, r.status)
		require.EqualValues(t, 1, f.api.charges.Load())
		require.EqualValues(t, 1, f.api.jobs.Load())
	})
}

// Non-JSON bodies are compared byte for byte.
func TestRawBodyFingerprint(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tr := f.transports()["httptest"]
	q := post("/charges", keyA, `amount=1`)
	q.contentType = "application/x-www-form-urlencoded"
	require.Equal(t, http.StatusCreated, tr.send(t, q).status)
	require.Equal(t, "true", tr.send(t, q).header.Get(httpguard.ReplayHeader))
	q.body = `amount=1&`
	require.Equal(t, http.StatusUnprocessableEntity, tr.send(t, q).status)
}

// Draft: a retry while the first request is in flight gets 409 with Retry-After.
func TestInFlightRetryIs409(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, f *fixture, tr transport) {
		first := make(chan reply, 1)
		go func() { first <- tr.send(t, post("/charges", keyA, `{"amount":5}`)) }()
		<-f.api.entered

		r := tr.send(t, post("/charges", keyA, `{"amount":5}`))
		require.Equal(t, http.StatusConflict, r.status)
		require.Equal(t, "1", r.header.Get("Retry-After"))
		p := r.problem(t)
		require.Equal(t, httpguard.ProblemInProgress, p.Type)
		require.NotEmpty(t, p.Residual)

		close(f.api.gate)
		require.Equal(t, http.StatusCreated, (<-first).status)
		r = tr.send(t, post("/charges", keyA, `{"amount":5}`))
		require.Equal(t, http.StatusCreated, r.status)
		require.Equal(t, "true", r.header.Get(httpguard.ReplayHeader))
		require.EqualValues(t, 1, f.api.charges.Load())
	}, func(o *setupOpts) {
		o.api.gate = make(chan struct{})
		o.api.entered = make(chan struct{}, 1)
	})
}

// A handler that answered 202 is stored as accepted: a retry gets the same 202 and
// Location, never a 200. Once a reconciler settled it as succeeded, a retry is sent to the
// status resource (303 See Other), still not a fabricated 200.
func TestAcceptedIsReplayedAs202(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, f *fixture, tr transport) {
		first := tr.send(t, post("/jobs", keyA, `{"report":"q1"}`))
		require.Equal(t, http.StatusAccepted, first.status)
		require.Equal(t, "/jobs/1/status", first.header.Get("Location"))
		r := f.residualOf("alice", keyA)
		require.Equal(t, residual.Accepted, r.State)
		require.Equal(t, "/jobs/1/status", r.Handle)

		check := func() {
			again := tr.send(t, post("/jobs", keyA, `{"report":"q1"}`))
			require.Equal(t, http.StatusAccepted, again.status)
			require.Equal(t, "/jobs/1/status", again.header.Get("Location"))
			require.Equal(t, first.body, again.body)
			require.Equal(t, "true", again.header.Get(httpguard.ReplayHeader))
		}
		check()
		check()
		_, err := f.store.Resolve(context.Background(), ledger.ResolveParams{
			Namespace: f.ic.Namespace(), Key: r.Key, As: residual.Succeeded, By: "probe", Note: "job finished",
		})
		require.NoError(t, err)
		done := tr.send(t, post("/jobs", keyA, `{"report":"q1"}`))
		require.Equal(t, http.StatusSeeOther, done.status)
		require.Equal(t, "/jobs/1/status", done.header.Get("Location"))
		require.Equal(t, "true", done.header.Get(httpguard.ReplayHeader))
		require.EqualValues(t, 1, f.api.jobs.Load())
	})
}

// An unknown outcome (the handler panicked) answers 500 once and 409 "being reconciled" to
// every retry until it is resolved; resolved as failed, the next retry runs again.
func TestPanicIsUnknownUntilResolved(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, f *fixture, tr transport) {
		first := tr.send(t, post("/panic", keyA, `{"amount":7}`))
		require.Equal(t, http.StatusInternalServerError, first.status)
		p := first.problem(t)
		require.Equal(t, httpguard.ProblemHandlerPanic, p.Type)
		require.NotContains(t, string(first.body), "half a response", "a partial answer never leaks")
		r := f.residualOf("alice", keyA)
		require.Equal(t, residual.Unknown, r.State)
		require.Equal(t, r.Key, p.Residual)

		for range 3 {
			again := tr.send(t, post("/panic", keyA, `{"amount":7}`))
			require.Equal(t, http.StatusConflict, again.status)
			p := again.problem(t)
			require.Equal(t, httpguard.ProblemReconciling, p.Type)
			require.Contains(t, p.Title, "being reconciled")
			require.Empty(t, again.header.Get("Retry-After"))
		}
		require.EqualValues(t, 1, f.api.panics.Load())

		_, err := f.store.Resolve(context.Background(), ledger.ResolveParams{
			Namespace: f.ic.Namespace(), Key: r.Key, As: residual.Failed, By: "ops", Note: "no charge upstream",
		})
		require.NoError(t, err)
		require.Equal(t, http.StatusInternalServerError, tr.send(t, post("/panic", keyA, `{"amount":7}`)).status)
		require.EqualValues(t, 2, f.api.panics.Load(), "resolved as failed: the retry ran again")
	})
}

// A reconciler that settles an unknown request as succeeded with EncodeResponse makes
// retries replay that response.
func TestResolvedWithRecordedResponse(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tr := f.transports()["listener"]
	require.Equal(t, http.StatusInternalServerError, tr.send(t, post("/panic", keyA, `{}`)).status)
	r := f.residualOf("alice", keyA)
	_, err := f.store.Resolve(context.Background(), ledger.ResolveParams{
		Namespace: f.ic.Namespace(), Key: r.Key, As: residual.Succeeded, By: "ops",
		Result: httpguard.EncodeResponse(http.StatusCreated, http.Header{"Content-Type": {"application/json"}}, []byte(`{"charge":"ch_found"}`)),
	})
	require.NoError(t, err)
	again := tr.send(t, post("/panic", keyA, `{}`))
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, `{"charge":"ch_found"}`, string(again.body))
	require.Equal(t, "true", again.header.Get(httpguard.ReplayHeader))
}

// A 5xx from the handler is an unknown outcome: the client sees the handler's answer once,
// retries get 409 until it is reconciled. A 4xx is a refusal: the retry runs again.
func TestHandlerErrors(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, f *fixture, tr transport) {
		first := tr.send(t, post("/broken", keyA, `{}`))
		require.Equal(t, http.StatusServiceUnavailable, first.status)
		require.Equal(t, "upstream timed out\n", string(first.body))
		again := tr.send(t, post("/broken", keyA, `{}`))
		require.Equal(t, http.StatusConflict, again.status)
		require.Equal(t, httpguard.ProblemReconciling, again.problem(t).Type)
		require.EqualValues(t, 1, f.api.broken.Load())

		for range 2 {
			r := tr.send(t, post("/refuse", keyB, `{"amount":-1}`))
			require.Equal(t, http.StatusBadRequest, r.status)
			require.Empty(t, r.header.Get(httpguard.ReplayHeader))
		}
		require.EqualValues(t, 2, f.api.refused.Load())
		require.Equal(t, residual.Failed, f.residualOf("alice", keyB).State)
	})
}

// Draft: the expiry policy. A settled key is kept until `toolfence gc` removes it after the
// retention the operator sets; after that the key is new again. An open key never expires.
func TestExpiry(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, f *fixture, tr transport) {
		require.Equal(t, http.StatusCreated, tr.send(t, post("/charges", keyA, `{"amount":1}`)).status)
		require.Equal(t, http.StatusInternalServerError, tr.send(t, post("/panic", keyB, `{}`)).status)

		// Within the retention nothing expires.
		f.clock.Advance(29 * 24 * time.Hour)
		res, err := f.store.GC(context.Background(), ledger.GCParams{Before: f.clock.Now().Add(-30 * 24 * time.Hour)})
		require.NoError(t, err)
		require.Zero(t, res.Deleted)
		require.Equal(t, "true", tr.send(t, post("/charges", keyA, `{"amount":1}`)).header.Get(httpguard.ReplayHeader))

		f.clock.Advance(2 * 24 * time.Hour)
		res, err = f.store.GC(context.Background(), ledger.GCParams{Before: f.clock.Now().Add(-30 * 24 * time.Hour)})
		require.NoError(t, err)
		require.Equal(t, 1, res.Deleted, "only the settled residual expires")

		r := tr.send(t, post("/charges", keyA, `{"amount":1}`))
		require.Equal(t, http.StatusCreated, r.status)
		require.Empty(t, r.header.Get(httpguard.ReplayHeader), "an expired key is a new request")
		require.Equal(t, `{"charge":"ch_2","amount":1}`, string(r.body))
		require.Greater(t, f.residualOf("alice", keyA).Token, uint64(1), "gc never resets the fencing token")

		u := tr.send(t, post("/panic", keyB, `{}`))
		require.Equal(t, http.StatusConflict, u.status, "an unknown outcome never expires silently")
		require.Equal(t, httpguard.ProblemReconciling, u.problem(t).Type)
	})
}

// Keys are scoped by principal: two tenants with the same key are two requests.
func TestKeysAreScopedByPrincipal(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, f *fixture, tr transport) {
		a := post("/charges", keyA, `{"amount":1}`)
		b := a
		b.principal = "bob"
		ra, rb := tr.send(t, a), tr.send(t, b)
		require.Equal(t, http.StatusCreated, ra.status)
		require.Equal(t, http.StatusCreated, rb.status)
		require.NotEqual(t, ra.body, rb.body)
		require.Equal(t, ra.body, tr.send(t, a).body)
		require.Equal(t, rb.body, tr.send(t, b).body)
		require.EqualValues(t, 2, f.api.charges.Load())
	})
}

func TestPrincipalErrors(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, f *fixture, tr transport) {
		anon := post("/charges", keyA, `{}`)
		anon.principal = ""
		r := tr.send(t, anon)
		require.Equal(t, http.StatusUnauthorized, r.status)
		require.Equal(t, httpguard.ProblemUnauthorized, r.problem(t).Type)
		require.Equal(t, "Bearer", r.header.Get("WWW-Authenticate"))

		banned := post("/charges", keyA, `{}`)
		banned.principal = "banned"
		r = tr.send(t, banned)
		require.Equal(t, http.StatusForbidden, r.status)
		require.Equal(t, httpguard.ProblemForbidden, r.problem(t).Type)
		require.Zero(t, f.api.charges.Load())
	})
}

func TestUnguardedMethodsPassThrough(t *testing.T) {
	t.Parallel()
	f := setup(t)
	r := f.transports()["httptest"].send(t, req{method: http.MethodGet, path: "/charges"})
	require.Equal(t, http.StatusOK, r.status)
	require.EqualValues(t, 1, f.api.reads.Load())
}

// Methods are compared without regard to case: a "post" to a route registered without a
// method is guarded like a POST (it used to pass unguarded and run twice), and "post" and
// "POST" with the same key and body are the same request.
func TestLowercaseMethodIsGuarded(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, f *fixture, tr transport) {
		lower := req{method: "post", path: "/notes", key: keyA, body: `{"n":1}`, principal: "alice", contentType: "application/json"}
		first := tr.send(t, lower)
		require.Equal(t, http.StatusCreated, first.status)
		again := tr.send(t, lower)
		require.Equal(t, http.StatusCreated, again.status)
		require.Equal(t, "true", again.header.Get(httpguard.ReplayHeader), "the retry is replayed")
		upper := lower
		upper.method = http.MethodPost
		require.Equal(t, "true", tr.send(t, upper).header.Get(httpguard.ReplayHeader), "post and POST are one request")
		require.EqualValues(t, 1, f.api.notes.Load(), "the handler ran once")

		noKey := req{method: "patch", path: "/notes", principal: "alice"}
		require.Equal(t, http.StatusBadRequest, tr.send(t, noKey).status, "a lowercase patch needs a key too")
		require.EqualValues(t, 1, f.api.notes.Load())
	})
}

func TestBodyTooLarge(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOpts) { o.guard = func(g *httpguard.Options) { g.MaxBody = 16 } })
	r := f.transports()["listener"].send(t, post("/charges", keyA, `{"amount":1,"memo":"too long for the cap"}`))
	require.Equal(t, http.StatusRequestEntityTooLarge, r.status)
	require.Equal(t, httpguard.ProblemBodyTooLarge, r.problem(t).Type)
	require.Zero(t, f.api.charges.Load())
}

// The handler sees the dispatch: the key and fencing token to fence its own writes with.
func TestHandlerSeesDispatch(t *testing.T) {
	t.Parallel()
	f := setup(t)
	r := f.transports()["httptest"].send(t, post("/charges", keyA, `{}`))
	require.Equal(t, "1", r.header.Get("X-Request-Token"))
}

// A ledger that cannot record the reservation means nothing runs (fail closed): 503.
func TestLedgerDownIs503(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.NoError(t, f.store.Close())
	r := f.transports()["httptest"].send(t, post("/charges", keyA, `{}`))
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Equal(t, httpguard.ProblemNotDispatched, r.problem(t).Type)
	require.Zero(t, f.api.charges.Load())
}

func TestDefaultClassify(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]residual.State{
		200: residual.Succeeded, 201: residual.Succeeded, 202: residual.Accepted, 204: residual.Succeeded,
		303: residual.Succeeded, 400: residual.Failed, 409: residual.Failed, 422: residual.Failed,
		500: residual.Unknown, 503: residual.Unknown, 504: residual.Unknown,
	} {
		require.Equal(t, want, httpguard.DefaultClassify(status), "status %d", status)
	}
}
