package tools

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/httpguard"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// toolfence's client and server agree with default options: a guarded tool whose client uses
// Transport calls an endpoint behind httpguard; the endpoint runs once, and a second client
// that lost its ledger (same task, same call, so the same key) is answered with the server's
// replay instead of a second effect.
func TestTransportAgainstHTTPGuard(t *testing.T) {
	t.Parallel()
	server := setup(t)
	var runs atomic.Int32
	var mu sync.Mutex
	var seen []string
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		mu.Lock()
		seen = append(seen, r.Header.Get(httpguard.KeyHeader))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"charge":"ch_%d"}`, n)
	})
	guard, err := httpguard.New(server.ic, httpguard.Options{ // default options
		Principal: func(*http.Request) (string, error) { return "agent", nil },
	})
	require.NoError(t, err)
	srv := httptest.NewServer(guard.Wrap(mux))
	t.Cleanup(srv.Close)

	call := func() (string, string) {
		client := setup(t) // a client with a ledger of its own
		g := Guard(httpTool("charge_invoice", srv.URL+"/charges"), client.ic, WithTarget("/invoice"), WithErrors())
		out, err := g.Call(client.ctx, `{"invoice":"INV-42","cents":100}`)
		require.NoError(t, err)
		return out, client.ic.Key("run-42", "charge_invoice", "INV-42")
	}
	first, key := call()
	require.Equal(t, `{"charge":"ch_1"}`, first)
	again, _ := call()
	require.Equal(t, first, again, "the server replays the recorded answer")
	require.EqualValues(t, 1, runs.Load(), "the endpoint ran once")
	require.Equal(t, []string{`"` + key + `"`}, seen, "the key arrives as a structured-field string")

	// The server's residual is the client's key under the principal.
	r, err := server.ic.Ledger().Get(context.Background(), ledger.GetParams{
		Namespace: server.ic.Namespace(), Key: server.ic.Key("agent", httpguard.DefaultOperation, key)})
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, r.State)
	require.Equal(t, key, r.Target, "the server's target is the key without the quotes")
}
