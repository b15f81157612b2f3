package httpguard_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/httpguard"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/tools"
)

// TestTransportInsideAGuardedHandlerSendsTheKey: the dispatch travels in the context, so a
// tools.Transport used inside an httpguard handler sends the guarded request's key and
// token to its own upstream (one helper for every surface, not one per package).
func TestTransportInsideAGuardedHandlerSendsTheKey(t *testing.T) {
	t.Parallel()
	var gotKey, gotToken string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotKey, gotToken = r.Header.Get(tools.HeaderIdempotencyKey), r.Header.Get(tools.HeaderFencingToken)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(upstream.Close)

	l, err := badger.Open(t.TempDir(), badger.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ic, err := interceptor.New(l, interceptor.Options{})
	require.NoError(t, err)
	g, err := httpguard.New(ic, httpguard.Options{Principal: func(*http.Request) (string, error) { return "tenant-1", nil }})
	require.NoError(t, err)
	client := &http.Client{Transport: &tools.Transport{}}
	var want interceptor.Dispatch
	h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want, _ = interceptor.DispatchFrom(r.Context())
		req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, upstream.URL, strings.NewReader(`{}`))
		require.NoError(t, err)
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		_ = resp.Body.Close()
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"sku":"A"}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", keyA)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.NotEmpty(t, want.Key)
	require.Contains(t, gotKey, want.Key, "the upstream got the guarded request's key")
	require.Equal(t, "1", gotToken)
}

// TestPrincipalNotUTF8IsABadRequest: a principal that is not valid UTF-8 cannot make a key
// (different bytes would collapse onto one); the request gets 400, not 500, and the
// handler does not run.
func TestPrincipalNotUTF8IsABadRequest(t *testing.T) {
	t.Parallel()
	f := setup(t)
	q := post("/charges", keyA, `{"amount":1}`)
	q.principal = "al\xffice"
	rep := inProcess{f.handler}.send(t, q)
	require.Equal(t, http.StatusBadRequest, rep.status, string(rep.body))
	require.Equal(t, httpguard.ProblemInvalidRequest, rep.problem(t).Type)
	require.Zero(t, f.api.charges.Load())
}
