package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
)

// upstream is a test server answering every request with the status and headers the test
// sets, and recording the headers it received.
type upstream struct {
	*httptest.Server
	mu      sync.Mutex
	got     []http.Header
	status  int
	headers map[string]string
	body    string
}

func newUpstream(t *testing.T, status int, body string, headers map[string]string) *upstream {
	u := &upstream{status: status, body: body, headers: headers}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.got = append(u.got, r.Header.Clone())
		u.mu.Unlock()
		for k, v := range u.headers {
			w.Header().Set(k, v)
		}
		w.WriteHeader(u.status)
		_, _ = io.WriteString(w, u.body)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) headersSeen() []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]http.Header(nil), u.got...)
}

func dispatchCtx(t *testing.T) (context.Context, interceptor.Dispatch) {
	d := interceptor.Dispatch{Key: residual.Key("ns", "task", "op", "target"), Token: 7, Attempt: 1}
	return WithDispatch(t.Context(), d), d
}

func post(t *testing.T, ctx context.Context, rt http.RoundTripper, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"a":1}`))
	require.NoError(t, err)
	req.Header.Set(HeaderIdempotencyKey, "caller-chosen")
	return (&http.Client{Transport: rt}).Do(req)
}

func TestTransportClassifiesAndForwardsKey(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status  int
		headers map[string]string
		body    string
		want    residual.State
		handle  string
	}{
		{status: 200, body: `{"id":"ch_1"}`, want: residual.Succeeded},
		{status: 201, want: residual.Succeeded},
		{status: 202, headers: map[string]string{"Location": "/jobs/9"}, body: `{"status":"queued"}`, want: residual.Accepted, handle: "/jobs/9"},
		{status: 202, body: `{"job_id":"J-7"}`, want: residual.Accepted, handle: "J-7"},
		{status: 202, body: `{"id":12}`, want: residual.Accepted, handle: "12"},
		{status: 400, want: residual.Failed}, {status: 401, want: residual.Failed}, {status: 403, want: residual.Failed},
		{status: 404, want: residual.Failed}, {status: 422, want: residual.Failed},
		{status: 408, want: residual.Unknown}, {status: 409, want: residual.Unknown}, {status: 425, want: residual.Unknown},
		{status: 429, want: residual.Unknown}, {status: 500, want: residual.Unknown}, {status: 503, want: residual.Unknown},
	}
	for _, c := range cases {
		t.Run(strconv.Itoa(c.status)+c.want.String(), func(t *testing.T) {
			t.Parallel()
			u := newUpstream(t, c.status, c.body, c.headers)
			var observed []Exchange
			tr := &Transport{Observe: func(e Exchange) { observed = append(observed, e) }}
			ctx, d := dispatchCtx(t)
			resp, err := post(t, ctx, tr, u.URL+"/charges")
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, c.body, string(body), "the tool still reads the whole body")

			seen := u.headersSeen()
			require.Len(t, seen, 1)
			require.Equal(t, `"`+d.Key+`"`, seen[0].Get(HeaderIdempotencyKey), "the key, quoted, replaces the caller's header")
			require.Equal(t, "7", seen[0].Get(HeaderFencingToken))

			ex, ok := stateFrom(ctx).observed()
			require.True(t, ok)
			require.Equal(t, c.want, ex.Outcome)
			require.Equal(t, c.status, ex.Status)
			sum := sha256.Sum256([]byte(c.body))
			require.Equal(t, hex.EncodeToString(sum[:]), ex.Digest)
			want := c.handle
			if strings.HasPrefix(want, "/") {
				want = u.URL + want
			}
			require.Equal(t, want, ex.Handle)
			require.Len(t, observed, 1)
		})
	}
}

func TestTransportOverrides(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, 409, "", nil)
	tr := &Transport{Overrides: map[int]residual.State{409: residual.Failed, 202: residual.Succeeded}}
	ctx, _ := dispatchCtx(t)
	resp, err := post(t, ctx, tr, u.URL)
	require.NoError(t, err)
	_ = resp.Body.Close()
	ex, _ := stateFrom(ctx).observed()
	require.Equal(t, residual.Failed, ex.Outcome)
	require.Equal(t, residual.Accepted, tr.classify(202), "a 202 is never a success, whatever the override says")
	require.Equal(t, residual.Unknown, (&Transport{Overrides: map[int]residual.State{200: residual.Pending}}).classify(200))
}

type failingRT struct{ err error }

func (f failingRT) RoundTrip(*http.Request) (*http.Response, error) { return nil, f.err }

func TestTransportErrorsAreUnknown(t *testing.T) {
	t.Parallel()
	ctx, _ := dispatchCtx(t)
	tr := &Transport{Base: failingRT{err: errors.New("connection reset")}}
	_, err := post(t, ctx, tr, "http://127.0.0.1:1/x")
	require.ErrorContains(t, err, "connection reset")
	ex, ok := stateFrom(ctx).observed()
	require.True(t, ok)
	require.Equal(t, residual.Unknown, ex.Outcome)
	require.Zero(t, ex.Status)

	// A call cut off after the request left (a timeout, a cancelled context) is unknown too.
	arrived, release := make(chan struct{}), make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		close(arrived)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer slow.Close()
	defer close(release)
	ctx2, _ := dispatchCtx(t)
	ctx2, cancel := context.WithCancel(ctx2)
	go func() { <-arrived; cancel() }()
	_, err = post(t, ctx2, &Transport{}, slow.URL)
	require.ErrorIs(t, err, context.Canceled)
	require.Error(t, err)
	ex, _ = stateFrom(ctx2).observed()
	require.Equal(t, residual.Unknown, ex.Outcome)
}

func TestTransportRefusesUnguardedSideEffects(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, 200, "ok", nil)
	_, err := post(t, t.Context(), &Transport{}, u.URL)
	require.ErrorIs(t, err, interceptor.ErrNoDispatch)
	require.ErrorIs(t, err, interceptor.ErrNoEffect, "provably not sent")
	require.Empty(t, u.headersSeen(), "nothing was sent")

	// Reads pass, without a key.
	resp, err := (&http.Client{Transport: &Transport{}}).Get(u.URL)
	require.NoError(t, err)
	_ = resp.Body.Close()
	resp, err = post(t, t.Context(), &Transport{AllowUnguarded: true}, u.URL)
	require.NoError(t, err)
	_ = resp.Body.Close()
	seen := u.headersSeen()
	require.Len(t, seen, 2)
	require.Empty(t, seen[0].Get(HeaderFencingToken))
}

func TestTransportSafeMethodsDoNotCount(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, 404, "", nil)
	ctx, d := dispatchCtx(t)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.URL, nil)
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: &Transport{}}).Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, `"`+d.Key+`"`, u.headersSeen()[0].Get(HeaderIdempotencyKey))
	_, ok := stateFrom(ctx).observed()
	require.False(t, ok, "a lookup's 404 is not the call's outcome")
}

func TestObservedCombinesExchanges(t *testing.T) {
	t.Parallel()
	S, A, F, U := residual.Succeeded, residual.Accepted, residual.Failed, residual.Unknown
	cases := []struct {
		in   []residual.State
		want residual.State
	}{
		{[]residual.State{S, S}, S}, {[]residual.State{F, F}, F}, {[]residual.State{S, A}, A},
		{[]residual.State{A, S}, A}, {[]residual.State{S, F}, U}, {[]residual.State{F, S}, U},
		{[]residual.State{S, U, S}, U}, {[]residual.State{A, F}, U},
	}
	for _, c := range cases {
		st := &dispatchState{}
		for i, o := range c.in {
			st.record(Exchange{Outcome: o, Status: 200 + i})
		}
		ex, ok := st.observed()
		require.True(t, ok)
		require.Equal(t, c.want, ex.Outcome, "%v", c.in)
	}
	_, ok := (&dispatchState{}).observed()
	require.False(t, ok)
}

func TestFromHTTP(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status   int
		headers  map[string]string
		want     residual.State
		noEffect bool
		errIs    error
	}{
		{status: 200, want: residual.Succeeded},
		{status: 202, headers: map[string]string{"Location": "https://api.example/jobs/1"}, want: residual.Accepted},
		{status: 422, want: residual.Failed, noEffect: true},
		{status: 404, want: residual.Failed, noEffect: true},
		{status: 503, want: residual.Unknown, errIs: ErrUpstreamStatus},
		{status: 429, want: residual.Unknown, errIs: ErrUpstreamStatus},
	}
	for _, c := range cases {
		u := newUpstream(t, c.status, `{"x":1}`, c.headers)
		resp, err := FromHTTP(http.Post(u.URL, "application/json", nil))
		require.Equal(t, c.want, resp.Outcome, "status %d", c.status)
		require.Equal(t, c.status, resp.Status)
		require.Equal(t, `{"x":1}`, string(resp.Body))
		require.Equal(t, c.want, interceptor.DefaultClassifier(resp, err), "the interceptor agrees, status %d", c.status)
		switch {
		case c.noEffect:
			require.ErrorIs(t, err, interceptor.ErrNoEffect)
		case c.errIs != nil:
			require.ErrorIs(t, err, c.errIs)
			require.NotErrorIs(t, err, interceptor.ErrNoEffect)
		default:
			require.NoError(t, err)
		}
		if c.status == 202 {
			require.Equal(t, "https://api.example/jobs/1", resp.Handle)
		}
	}
	_, err := FromHTTP(nil, errors.New("dial tcp: refused"))
	require.ErrorContains(t, err, "refused")
	require.Equal(t, residual.Unknown, interceptor.DefaultClassifier(interceptor.Response{}, err))
}

// The key is sent as the draft's structured-field string by default, bare with BareKey.
func TestTransportKeyForm(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, 201, "", nil)
	ctx, d := dispatchCtx(t)
	for _, tr := range []*Transport{{}, {BareKey: true}} {
		resp, err := post(t, ctx, tr, u.URL)
		require.NoError(t, err)
		_ = resp.Body.Close()
	}
	seen := u.headersSeen()
	require.Equal(t, `"`+d.Key+`"`, seen[0].Get(HeaderIdempotencyKey))
	require.Equal(t, d.Key, seen[1].Get(HeaderIdempotencyKey))
}
