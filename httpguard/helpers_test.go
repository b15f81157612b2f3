package httpguard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/httpguard"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

var epoch = time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)

const (
	testTTL = 10 * time.Second
	keyA    = `"8e03978e-40d5-43e8-bc93-6894a57f9324"`
	keyB    = `"0b6c2a4e-7d1f-4f55-9a3e-2f1d8c9e6b70"`
)

// fixture is one test's world: a fake clock driving a real badger ledger and the
// interceptor, a guarded test API, and counters of how often each endpoint's handler ran.
type fixture struct {
	t       *testing.T
	clock   *lease.Fake
	store   ledger.Ledger
	ic      *interceptor.Interceptor
	guard   *httpguard.Guard
	handler http.Handler
	api     *api
}

// api is the guarded application: every endpoint counts its runs.
type api struct {
	charges atomic.Int64
	jobs    atomic.Int64
	panics  atomic.Int64
	refused atomic.Int64
	broken  atomic.Int64
	reads   atomic.Int64
	// notes counts runs of /notes, a route registered without a method.
	notes atomic.Int64
	// gate, when set, blocks POST /charges until it is closed; entered is signalled first.
	gate    chan struct{}
	entered chan struct{}
}

func (a *api) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		n := a.charges.Add(1)
		if a.entered != nil {
			a.entered <- struct{}{}
		}
		if a.gate != nil {
			<-a.gate
		}
		var in struct {
			Amount int `json:"amount"`
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		d, _ := interceptor.DispatchFrom(r.Context())
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/charges/ch_%d", n))
		w.Header().Set("Set-Cookie", "session=secret") // never stored
		w.Header().Set("X-Request-Token", fmt.Sprint(d.Token))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":"ch_%d","amount":%d}`, n, in.Amount)
	})
	mux.HandleFunc("PATCH /charges/{id}", func(w http.ResponseWriter, r *http.Request) {
		n := a.charges.Add(1)
		fmt.Fprintf(w, `{"patched":%d}`, n)
	})
	mux.HandleFunc("POST /jobs", func(w http.ResponseWriter, r *http.Request) {
		n := a.jobs.Add(1)
		w.Header().Set("Location", fmt.Sprintf("/jobs/%d/status", n))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"job":%d,"state":"queued"}`, n)
	})
	mux.HandleFunc("POST /panic", func(w http.ResponseWriter, r *http.Request) {
		a.panics.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("half a response"))
		panic("the payment client crashed")
	})
	mux.HandleFunc("POST /refuse", func(w http.ResponseWriter, r *http.Request) {
		a.refused.Add(1)
		http.Error(w, "amount must be positive", http.StatusBadRequest)
	})
	mux.HandleFunc("POST /broken", func(w http.ResponseWriter, r *http.Request) {
		a.broken.Add(1)
		http.Error(w, "upstream timed out", http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/notes", func(w http.ResponseWriter, r *http.Request) {
		n := a.notes.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"note":%d}`, n)
	})
	mux.HandleFunc("GET /charges", func(w http.ResponseWriter, r *http.Request) {
		a.reads.Add(1)
		_, _ = w.Write([]byte(`[]`))
	})
	return mux
}

// bearer is the test principal function: "Authorization: Bearer NAME"; "banned" is
// forbidden.
func bearer(r *http.Request) (string, error) {
	name, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch {
	case !ok || name == "":
		return "", fmt.Errorf("%w: no bearer token", ledger.ErrUnauthorized)
	case name == "banned":
		return "", fmt.Errorf("%w: %s may not charge", ledger.ErrForbidden, name)
	}
	return "tenant:" + name, nil
}

type setupOpts struct {
	guard func(*httpguard.Options)
	api   *api
	clock *lease.Fake
	dir   string
}

func setup(t *testing.T, mods ...func(*setupOpts)) *fixture {
	t.Helper()
	o := setupOpts{api: &api{}, clock: lease.NewFake(epoch), dir: t.TempDir()}
	for _, m := range mods {
		m(&o)
	}
	store, err := badger.Open(o.dir, badger.Options{Clock: o.clock})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	ic, err := interceptor.New(store, interceptor.Options{Holder: "api-1", LeaseTTL: testTTL, Clock: o.clock})
	require.NoError(t, err)
	opts := httpguard.Options{Principal: bearer, Logger: slog.New(slog.DiscardHandler)}
	if o.guard != nil {
		o.guard(&opts)
	}
	g, err := httpguard.New(ic, opts)
	require.NoError(t, err)
	return &fixture{t: t, clock: o.clock, store: store, ic: ic, guard: g, handler: g.Wrap(o.api.routes()), api: o.api}
}

// reply is a response as the client saw it.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) problem(t *testing.T) httpguard.Problem {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), "body: %s", r.body)
	var p httpguard.Problem
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Equal(t, r.status, p.Status, "the problem's status member matches the response")
	require.NotEmpty(t, p.Type)
	require.NotEmpty(t, p.Title)
	require.NotEmpty(t, p.Detail)
	return p
}

// req describes a request; key is the raw Idempotency-Key header value ("" for none).
type req struct {
	method, path, key, body, principal string
	extraKeys                          []string
	contentType                        string
}

func post(path, key, body string) req {
	return req{method: http.MethodPost, path: path, key: key, body: body, principal: "alice", contentType: "application/json"}
}

func (q req) build(base string) *http.Request {
	r := httptest.NewRequest(q.method, base+q.path, strings.NewReader(q.body))
	if base != "" {
		var err error
		r, err = http.NewRequest(q.method, base+q.path, strings.NewReader(q.body))
		if err != nil {
			panic(err)
		}
	}
	if q.key != "" {
		r.Header.Set(httpguard.KeyHeader, q.key)
	}
	for _, k := range q.extraKeys {
		r.Header.Add(httpguard.KeyHeader, k)
	}
	if q.principal != "" {
		r.Header.Set("Authorization", "Bearer "+q.principal)
	}
	if q.contentType != "" {
		r.Header.Set("Content-Type", q.contentType)
	}
	return r
}

// transport sends a request to the guarded handler: in process through httptest's
// recorder, or over a real TCP listener.
type transport interface {
	send(t *testing.T, q req) reply
}

type inProcess struct{ h http.Handler }

// send may run on goroutines other than the test's, so it reports failures with Errorf and
// returns a zero reply (status 0) instead of stopping the goroutine.
func (tr inProcess) send(t *testing.T, q req) reply {
	rec := httptest.NewRecorder()
	tr.h.ServeHTTP(rec, q.build(""))
	res := rec.Result()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Errorf("read body: %v", err)
		return reply{}
	}
	return reply{status: res.StatusCode, header: res.Header, body: body}
}

type listener struct {
	url    string
	client *http.Client
}

func (tr listener) send(t *testing.T, q req) reply {
	res, err := tr.client.Do(q.build(tr.url).WithContext(t.Context()))
	if err != nil {
		t.Errorf("%s %s: %v", q.method, q.path, err)
		return reply{}
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Errorf("read body: %v", err)
		return reply{}
	}
	return reply{status: res.StatusCode, header: res.Header, body: body}
}

// transports returns both ways of reaching f's handler.
func (f *fixture) transports() map[string]transport {
	srv := httptest.NewServer(f.handler)
	f.t.Cleanup(srv.Close)
	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return map[string]transport{
		"httptest": inProcess{h: f.handler},
		"listener": listener{url: srv.URL, client: client},
	}
}

// eachTransport runs body once per transport, each with a fresh fixture.
func eachTransport(t *testing.T, body func(t *testing.T, f *fixture, tr transport), mods ...func(*setupOpts)) {
	for _, name := range []string{"httptest", "listener"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, mods...)
			body(t, f, f.transports()[name])
		})
	}
}

// residualOf returns the residual of a request by principal and raw key.
func (f *fixture) residualOf(principal, quotedKey string) *residual.Residual {
	f.t.Helper()
	key := f.ic.Key("tenant:"+principal, httpguard.DefaultOperation, strings.Trim(quotedKey, `"`))
	r, err := f.store.Get(context.Background(), ledger.GetParams{Namespace: f.ic.Namespace(), Key: key})
	require.NoError(f.t, err)
	return r
}
