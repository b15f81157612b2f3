package remote_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/remote"
	"github.com/toolfence/toolfence/residual"
)

// boundTo authorizes every request with token, bound to namespace ns, declaring the
// operations in idempotent upstream-idempotent.
func boundTo(ns string, idempotent ...string) remote.Authorizer {
	static := remote.StaticToken(token, ns)
	return func(r *http.Request) (remote.Access, error) {
		acc, err := static(r)
		acc.UpstreamIdempotent = func(op string) bool {
			for _, o := range idempotent {
				if o == op {
					return true
				}
			}
			return false
		}
		return acc, err
	}
}

// Two clients with the same bearer token: the second reads the first's holder and token
// (get shows them) but can neither commit nor renew that attempt; the first can. The
// holder is recorded qualified by the first client's proof, and returned as it was named.
func TestBoundCommitNeedsTheReservingClient(t *testing.T) {
	clock := lease.NewFake(start)
	b := openBadger(t, t.TempDir(), clock)
	endpoint := serve(t, remote.Handler(b, remote.HandlerOptions{Authorize: boundTo("team")}), false)
	first := dial(t, endpoint, remote.Options{Token: token})
	second := dial(t, endpoint, remote.Options{Token: token})
	ctx := t.Context()

	p := reserveParams("team", "invoice:1")
	p.Holder = "agent-1"
	res, err := first.Reserve(ctx, p)
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, res.Decision)
	require.Equal(t, "agent-1", res.Lease.Holder, "the client's caller sees its holder as it named it")
	require.Equal(t, "agent-1", res.Residual.Current().Holder)

	seen, err := second.Get(ctx, ledger.GetParams{Namespace: "team", Key: p.Key})
	require.NoError(t, err)
	require.Equal(t, "agent-1", seen.Current().Holder)
	stored, err := b.Get(ctx, ledger.GetParams{Namespace: "team", Key: p.Key})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(stored.Current().Holder, "agent-1@"), "stored qualified: %s", stored.Current().Holder)

	forged := ledger.CommitParams{Namespace: "team", Key: p.Key, Holder: "agent-1", Token: res.Lease.Token, Outcome: residual.Failed}
	_, err = second.Commit(ctx, forged)
	require.ErrorIs(t, err, residual.ErrLeaseLost, "the second client cannot settle the first's attempt")
	forged.Holder = stored.Current().Holder // the qualified holder, as the server stores it
	_, err = second.Commit(ctx, forged)
	require.ErrorIs(t, err, residual.ErrLeaseLost)
	_, err = second.Renew(ctx, ledger.RenewParams{Namespace: "team", Key: p.Key, Holder: "agent-1", Token: res.Lease.Token, TTL: time.Hour})
	require.ErrorIs(t, err, residual.ErrLeaseLost, "nor keep it alive")

	again, err := second.Reserve(ctx, p)
	require.NoError(t, err)
	require.Equal(t, ledger.InProgress, again.Decision, "the key stays in progress: no second dispatch")

	l, err := first.Renew(ctx, ledger.RenewParams{Namespace: "team", Key: p.Key, Holder: "agent-1", Token: res.Lease.Token, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, "agent-1", l.Holder)
	done, err := first.Commit(ctx, ledger.CommitParams{Namespace: "team", Key: p.Key, Holder: "agent-1", Token: res.Lease.Token, Outcome: residual.Succeeded})
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, done.State)
	require.Equal(t, "agent-1", done.Current().Holder)
}

// A reserve, commit or renew bound to a namespace without a proof is refused (403,
// not_holder) before the ledger is called.
func TestBoundStepsWithoutProofAreRefused(t *testing.T) {
	b := openBadger(t, t.TempDir(), lease.NewFake(start))
	endpoint := serve(t, remote.Handler(b, remote.HandlerOptions{Authorize: boundTo("team")}), false)
	p := reserveParams("team", "invoice:1")
	for method, body := range map[string]any{
		"reserve": p,
		"commit":  ledger.CommitParams{Namespace: "team", Key: p.Key, Holder: "h", Token: 1, Outcome: residual.Failed},
		"renew":   ledger.RenewParams{Namespace: "team", Key: p.Key, Holder: "h", Token: 1, TTL: time.Minute},
	} {
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, endpoint+remote.Path+method, bytes.NewReader(raw))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s: %s", method, msg)
		require.Contains(t, string(msg), "not_holder", method)
		require.Contains(t, string(msg), "no proof of holding", method)
	}
	_, err := b.Get(t.Context(), ledger.GetParams{Namespace: "team", Key: p.Key})
	require.ErrorIs(t, err, residual.ErrNotFound, "nothing was reserved")
}

// Over a bound request, a reserve re-dispatches over an unknown outcome only for an
// operation the server declares upstream-idempotent; for any other it gets the unknown
// outcome, whatever Redispatch says.
func TestBoundRedispatchOnlyForDeclaredOperations(t *testing.T) {
	for _, tc := range []struct {
		name     string
		declared []string
		want     ledger.Decision
	}{
		{"undeclared", nil, ledger.UnknownOutcome},
		{"another operation declared", []string{"refund"}, ledger.UnknownOutcome},
		{"declared", []string{"op"}, ledger.Acquired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := lease.NewFake(start)
			b := openBadger(t, t.TempDir(), clock)
			endpoint := serve(t, remote.Handler(b, remote.HandlerOptions{Authorize: boundTo("team", tc.declared...)}), false)
			c := dial(t, endpoint, remote.Options{Token: token})
			p := reserveParams("team", "invoice:1")
			p.Redispatch = true
			res, err := c.Reserve(t.Context(), p)
			require.NoError(t, err)
			require.Equal(t, ledger.Acquired, res.Decision, "a free key is reserved whatever is declared")
			clock.Advance(2 * p.TTL) // the attempt's lease expires: its outcome is unknown
			res, err = c.Reserve(t.Context(), p)
			require.NoError(t, err)
			require.Equal(t, tc.want, res.Decision)
		})
	}
}
