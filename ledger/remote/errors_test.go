package remote_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/remote"
	"github.com/toolfence/toolfence/residual"
)

const token = "0123456789abcdef0123456789abcdef"

func reserveParams(ns, target string) ledger.ReserveParams {
	return ledger.ReserveParams{
		Namespace: ns, Key: residual.Key(ns, "task", "op", target), Task: "task", Operation: "op", Target: target,
		Holder: "h", RequestDigest: "d", TTL: time.Minute,
	}
}

// A request bound to a namespace by its token may use that namespace only: another one,
// every namespace (GC, Watch without one) and the all-namespace count are refused (403).
func TestTokenBoundToNamespace(t *testing.T) {
	b := openBadger(t, t.TempDir(), lease.NewFake(start))
	endpoint := serve(t, remote.Handler(b, remote.HandlerOptions{Authorize: remote.StaticToken(token, "team-a")}), false)
	c := dial(t, endpoint, remote.Options{Token: token})
	ctx := t.Context()

	res, err := c.Reserve(ctx, reserveParams("team-a", "x"))
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, res.Decision)

	_, err = c.Reserve(ctx, reserveParams("team-b", "x"))
	require.ErrorIs(t, err, ledger.ErrForbidden)
	require.NotErrorIs(t, err, ledger.ErrOutcomeUnknown, "a refused step did not run")
	require.Contains(t, err.Error(), `bound to namespace "team-a"`)
	require.Contains(t, err.Error(), `"team-b"`)
	_, err = b.Get(ctx, ledger.GetParams{Namespace: "team-b", Key: reserveParams("team-b", "x").Key})
	require.ErrorIs(t, err, residual.ErrNotFound, "nothing was written in the other namespace")

	_, err = c.Get(ctx, ledger.GetParams{Namespace: "team-b", Key: reserveParams("team-b", "x").Key})
	require.ErrorIs(t, err, ledger.ErrForbidden)
	_, err = c.List(ctx, ledger.ListParams{Namespace: "team-b"})
	require.ErrorIs(t, err, ledger.ErrForbidden)
	_, err = c.GC(ctx, ledger.GCParams{Before: start})
	require.ErrorIs(t, err, ledger.ErrForbidden, "GC of every namespace")
	require.Contains(t, err.Error(), "every namespace")
	_, err = c.OpenResiduals(ctx)
	require.ErrorIs(t, err, ledger.ErrForbidden)
	_, err = c.Watch(ctx, "")
	require.ErrorIs(t, err, ledger.ErrForbidden)
	_, err = c.Watch(ctx, "team-b")
	require.ErrorIs(t, err, ledger.ErrForbidden)

	page, err := c.List(ctx, ledger.ListParams{Namespace: "team-a"})
	require.NoError(t, err)
	require.Len(t, page.Residuals, 1)
	_, err = c.GC(ctx, ledger.GCParams{Namespace: "team-a", Before: start})
	require.NoError(t, err)
}

// A wrong or missing token gets 401 and an error wrapping ledger.ErrUnauthorized that says so.
func TestWrongToken(t *testing.T) {
	b := openBadger(t, t.TempDir(), lease.NewFake(start))
	endpoint := serve(t, remote.Handler(b, remote.HandlerOptions{Authorize: remote.StaticToken(token, "team-a")}), false)
	for name, tok := range map[string]string{"wrong": strings.Repeat("z", 32), "missing": ""} {
		t.Run(name, func(t *testing.T) {
			c := dial(t, endpoint, remote.Options{Token: tok})
			_, err := c.Reserve(t.Context(), reserveParams("team-a", "x"))
			require.ErrorIs(t, err, ledger.ErrUnauthorized)
			require.NotErrorIs(t, err, ledger.ErrOutcomeUnknown)
			require.Contains(t, err.Error(), "401 Unauthorized")
			var re *remote.Error
			require.ErrorAs(t, err, &re)
			require.Equal(t, http.StatusUnauthorized, re.Status)
		})
	}
	_, err := b.Get(t.Context(), ledger.GetParams{Namespace: "team-a", Key: reserveParams("team-a", "x").Key})
	require.ErrorIs(t, err, residual.ErrNotFound, "nothing was written")
}

// dropAfter runs the step, then drops the connection without answering.
func dropAfter(inner http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner.ServeHTTP(httptest.NewRecorder(), r)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	})
}

// A mutating step whose answer is lost returns ErrOutcomeUnknown (it did happen here); a
// read whose answer is lost returns ErrConnectionLost only.
func TestLostAnswerIsOutcomeUnknown(t *testing.T) {
	b := openBadger(t, t.TempDir(), lease.NewFake(start))
	endpoint := serve(t, dropAfter(remote.Handler(b, remote.HandlerOptions{Authorize: remote.AllNamespaces()})), false)
	c := dial(t, endpoint, remote.Options{})
	p := reserveParams("ns", "x")
	_, err := c.Reserve(t.Context(), p)
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
	require.ErrorIs(t, err, remote.ErrConnectionLost)
	require.Contains(t, err.Error(), "may or may not have happened")
	got, err := b.Get(t.Context(), ledger.GetParams{Namespace: "ns", Key: p.Key})
	require.NoError(t, err, "the step happened although its answer was lost")
	require.Equal(t, residual.Pending, got.State)

	_, err = c.Commit(t.Context(), ledger.CommitParams{Namespace: "ns", Key: p.Key, Holder: "h", Token: got.Token, Outcome: residual.Succeeded})
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)

	_, err = c.Get(t.Context(), ledger.GetParams{Namespace: "ns", Key: p.Key})
	require.ErrorIs(t, err, remote.ErrConnectionLost)
	require.NotErrorIs(t, err, ledger.ErrOutcomeUnknown, "a read changes nothing")
}

// A mutating step that times out after it was sent returns ErrOutcomeUnknown.
func TestTimeoutIsOutcomeUnknown(t *testing.T) {
	release := make(chan struct{})
	hang := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	endpoint := serve(t, hang, false)
	defer close(release)
	c := dial(t, endpoint, remote.Options{Timeout: 50 * time.Millisecond})
	_, err := c.Resolve(t.Context(), ledger.ResolveParams{Namespace: "ns", Key: reserveParams("ns", "x").Key, As: residual.Failed, By: "me"})
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// A server that cannot be reached gets ledger.ErrUnavailable: the step did not happen.
func TestUnreachableIsUnavailable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	endpoint := srv.URL
	srv.Close()
	c := dial(t, endpoint, remote.Options{})
	_, err := c.Reserve(t.Context(), reserveParams("ns", "x"))
	require.ErrorIs(t, err, ledger.ErrUnavailable)
	require.NotErrorIs(t, err, ledger.ErrOutcomeUnknown)
	require.True(t, remote.IsUnavailable(err))
}

// Malformed requests are refused before anything runs: unknown fields, trailing data, an
// oversized body, an unknown method, GET.
func TestMalformedRequests(t *testing.T) {
	b := openBadger(t, t.TempDir(), lease.NewFake(start))
	endpoint := serve(t, remote.Handler(b, remote.HandlerOptions{Authorize: remote.AllNamespaces(), MaxBody: 4096}), false)
	post := func(method, body string) (int, string) {
		resp, err := http.Post(endpoint+remote.Path+method, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	key := reserveParams("ns", "x").Key
	status, body := post("get", `{"Namespace":"ns","Key":"`+key+`","Extra":1}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, `unknown field \"Extra\"`)
	status, body = post("get", `{"Namespace":"ns","Key":"`+key+`"} {}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, "more than one JSON value")
	status, body = post("commit", `{"Namespace":"`+strings.Repeat("n", 5000)+`"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, status)
	require.Contains(t, body, "exceeds 4096 bytes")
	status, body = post("delete", `{}`)
	require.Equal(t, http.StatusNotFound, status)
	require.Contains(t, body, `no ledger method \"delete\"`)
	resp, err := http.Get(endpoint + remote.Path + "get")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	// The client sees a 400 as a protocol error, never as an unknown outcome.
	c := dial(t, endpoint, remote.Options{})
	_, err = c.Commit(t.Context(), ledger.CommitParams{Namespace: "ns", Key: key, Holder: strings.Repeat("h", 5000), Token: 1, Outcome: residual.Failed})
	require.ErrorIs(t, err, remote.ErrProtocol)
	require.NotErrorIs(t, err, ledger.ErrOutcomeUnknown)
}

// A backend error keeps its sentinels and its text; params refused by the backend wrap
// ErrInvalidParams and residual.ErrInvalidKey as on the backend.
func TestErrorsRoundTrip(t *testing.T) {
	b := openBadger(t, t.TempDir(), lease.NewFake(start))
	c := dial(t, serve(t, remote.Handler(b, remote.HandlerOptions{Authorize: remote.AllNamespaces()}), true), remote.Options{})
	_, want := b.Get(t.Context(), ledger.GetParams{Namespace: "ns", Key: "nope"})
	_, err := c.Get(t.Context(), ledger.GetParams{Namespace: "ns", Key: "nope"})
	require.ErrorIs(t, err, ledger.ErrInvalidParams)
	require.ErrorIs(t, err, residual.ErrInvalidKey)
	require.EqualError(t, err, want.Error())
	_, err = c.Reserve(t.Context(), ledger.ReserveParams{Namespace: "ns", Key: reserveParams("ns", "x").Key})
	require.ErrorIs(t, err, ledger.ErrInvalidParams)
	var re *remote.Error
	require.ErrorAs(t, err, &re)
	require.Equal(t, []string{"invalid_params"}, re.Codes)
}

// A 200 answer with neither a result nor an error (an intermediary, a buggy or newer
// server) is no answer: a mutating step's outcome is unknown, a read is a protocol error.
// It never comes back as a nil result with a nil error, on which the interceptor would
// panic.
func TestAnswerWithoutResultIsLost(t *testing.T) {
	for _, answer := range []string{`{}`, `{"result":null}`} {
		t.Run(answer, func(t *testing.T) {
			endpoint := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(answer))
			}), false)
			c := dial(t, endpoint, remote.Options{})
			res, err := c.Reserve(t.Context(), reserveParams("ns", "x"))
			require.Nil(t, res)
			require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
			require.Contains(t, err.Error(), "neither a result nor an error")
			_, err = c.Resolve(t.Context(), ledger.ResolveParams{Namespace: "ns", Key: reserveParams("ns", "x").Key, As: residual.Failed, By: "me"})
			require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
			_, err = c.Get(t.Context(), ledger.GetParams{Namespace: "ns", Key: reserveParams("ns", "x").Key})
			require.ErrorIs(t, err, remote.ErrProtocol)
			require.NotErrorIs(t, err, ledger.ErrOutcomeUnknown)

			ic, err := interceptor.New(c, interceptor.Options{LeaseTTL: 5 * time.Second})
			require.NoError(t, err)
			a, replay, err := ic.Begin(interceptor.WithTask(t.Context(), "t"), interceptor.Call{Operation: "op", Target: "x", Args: []byte(`{}`)}, interceptor.BeginOptions{})
			require.Nil(t, a)
			require.Nil(t, replay)
			require.ErrorIs(t, err, ledger.ErrOutcomeUnknown, "Begin reports the lost answer and does not panic")
		})
	}
	// An empty count of open residuals is null on the wire, and fine.
	c := dial(t, serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"result":null}`))
	}), false), remote.Options{})
	open, err := c.OpenResiduals(t.Context())
	require.NoError(t, err)
	require.Empty(t, open)
}

// A 5xx whose JSON body carries no code of this protocol (a gateway's error page in JSON)
// is a lost answer: for a mutating step the step may have run (ErrOutcomeUnknown), never
// "did not happen". The server's own 503 (ledger closed) stays ledger.ErrUnavailable.
func TestGateway5xxIsOutcomeUnknown(t *testing.T) {
	for _, answer := range []string{`{}`, `{"error":{"message":"bad gateway"}}`, `{"error":{"message":"x","codes":["gateway_timeout"]}}`} {
		endpoint := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte(answer))
		}), false)
		c := dial(t, endpoint, remote.Options{})
		_, err := c.Commit(t.Context(), ledger.CommitParams{Namespace: "ns", Key: reserveParams("ns", "x").Key, Holder: "h", Token: 1, Outcome: residual.Succeeded})
		require.ErrorIs(t, err, ledger.ErrOutcomeUnknown, answer)
		require.NotErrorIs(t, err, remote.ErrProtocol, answer)
		require.Contains(t, err.Error(), "HTTP 502", answer)
	}

	b := openBadger(t, t.TempDir(), lease.NewFake(start))
	c := dial(t, serve(t, remote.Handler(b, remote.HandlerOptions{Authorize: remote.AllNamespaces()}), false), remote.Options{})
	require.NoError(t, b.Close())
	_, err := c.Reserve(t.Context(), reserveParams("ns", "x"))
	require.ErrorIs(t, err, ledger.ErrUnavailable)
	require.NotErrorIs(t, err, ledger.ErrOutcomeUnknown, "the server refused before running the step")
}
