package remote_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger/remote"
)

// A web page the user visits can make the browser POST to a ledger served on loopback
// without tokens ("simple" requests: text/plain, no preflight). The handler refuses them
// whatever its Authorizer grants: a POST that is not application/json (415) and any request
// from a non-loopback Origin (403); the ledger is not called, so the succeeded residual
// survives and the next identical call still replays.
func TestHandlerRefusesRequestsFromWebPages(t *testing.T) {
	l := openBadger(t, t.TempDir(), lease.Real{})
	h := remote.Handler(l, remote.HandlerOptions{Authorize: func(*http.Request) (remote.Access, error) {
		return remote.Access{Namespace: "default"}, nil // serve --http without tokens
	}})
	endpoint := serve(t, h, false)
	c := dial(t, endpoint, remote.Options{})
	ic, err := interceptor.New(c, interceptor.Options{LeaseTTL: 5 * time.Second, Namespace: "default"})
	require.NoError(t, err)
	ctx := interceptor.WithTask(context.Background(), "t")
	call := interceptor.Call{Operation: "charge", Target: "order:1", Args: []byte(`{"a":1}`)}
	a, _, err := ic.Begin(ctx, call, interceptor.BeginOptions{})
	require.NoError(t, err)
	_, err = a.Report(ctx, interceptor.Report{Outcome: "succeeded", Body: []byte(`{"ok":true}`)})
	require.NoError(t, err)

	post := func(contentType, origin string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, endpoint+remote.Path+"gc",
			strings.NewReader(`{"Namespace":"default","Before":"2999-01-01T00:00:00Z"}`))
		require.NoError(t, err)
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// What fetch(url, {method: "POST", mode: "no-cors", body}) sends.
	status, body := post("text/plain;charset=UTF-8", "https://evil.example")
	require.Equal(t, http.StatusForbidden, status)
	require.Contains(t, body, "not a loopback origin")
	require.Contains(t, body, `"forbidden"`)
	status, body = post("text/plain;charset=UTF-8", "")
	require.Equal(t, http.StatusUnsupportedMediaType, status)
	require.Contains(t, body, "application/json")
	require.Contains(t, body, `"protocol"`)
	status, _ = post("", "")
	require.Equal(t, http.StatusUnsupportedMediaType, status)
	status, _ = post("application/json", "null")
	require.Equal(t, http.StatusForbidden, status)

	a2, replay, err := ic.Begin(ctx, call, interceptor.BeginOptions{})
	require.NoError(t, err)
	require.Nil(t, a2, "no new attempt: the effect is not dispatched a second time")
	require.NotNil(t, replay)

	// A page on loopback (a local tool's UI) sending application/json is served.
	status, body = post("application/json; charset=utf-8", "http://localhost:6274")
	require.Equal(t, http.StatusOK, status, body)
}
