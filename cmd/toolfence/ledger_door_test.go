package main

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/remote"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// TestLedgerProtocolIsNoWayAroundTheBarrier: the raw ledger of `serve --http` (/ledger/v1/)
// gives no second dispatch for a key begun over MCP. An MCP agent's token cannot reach it
// at all; a token granted it can read the holder and token of another's attempt but can
// neither settle nor renew that attempt, and its reserve does not re-dispatch over an
// unknown outcome of an operation the server does not declare upstream-idempotent, nor
// supersede it.
func TestLedgerProtocolIsNoWayAroundTheBarrier(t *testing.T) {
	t.Parallel()
	_, url, _ := teamServe(t)
	base := strings.TrimSuffix(url, mcpwire.Path)
	ctx := t.Context()
	agent1, err := mcpserver.Dial(ctx, url, serveToken)
	require.NoError(t, err)
	defer agent1.Close()
	agent2, err := mcpserver.Dial(ctx, url, serveToken)
	require.NoError(t, err)
	defer agent2.Close()
	call := map[string]any{"task": "t", "operation": "charge", "target": "invoice:1", "args": map[string]any{"amount": 5}}
	var first mcpserver.BeginResult
	require.NoError(t, agent1.Call(ctx, "begin_call", call, &first))
	require.Equal(t, mcpserver.DecisionProceed, first.Decision)

	// An MCP agent's token gets 403 on the raw ledger, for reads and writes alike.
	for _, method := range []string{"get", "commit"} {
		body := `{"Namespace":"team","Key":"` + first.Key + `"}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+remote.Path+method, bytes.NewReader([]byte(body)))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+serveToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s: %s", method, msg)
		require.Contains(t, string(msg), "not_granted")
		require.Contains(t, string(msg), "TOKEN NAMESPACE ledger")
	}

	// A token granted the ledger sees the attempt but cannot settle it.
	raw, err := remote.New(base, remote.Options{Token: ledgerToken})
	require.NoError(t, err)
	defer raw.Close()
	r, err := raw.Get(ctx, ledger.GetParams{Namespace: "team", Key: first.Key})
	require.NoError(t, err)
	holder := r.Current().Holder
	_, err = raw.Commit(ctx, ledger.CommitParams{Namespace: "team", Key: first.Key, Holder: holder, Token: first.Token, Outcome: residual.Failed})
	require.ErrorIs(t, err, residual.ErrLeaseLost, "the holder read from get proves nothing")
	var second mcpserver.BeginResult
	require.NoError(t, agent2.Call(ctx, "begin_call", call, &second))
	require.NotEqual(t, mcpserver.DecisionProceed, second.Decision, "no second dispatch: %+v", second)

	// The holder records the outcome as unknown; a raw re-dispatch is still refused.
	var c mcpserver.CommitResult
	require.NoError(t, agent1.Call(ctx, "commit_call", map[string]any{"key": first.Key, "token": first.Token, "lease_secret": first.LeaseSecret, "outcome": "unknown"}, &c))
	res, err := raw.Reserve(ctx, ledger.ReserveParams{
		Namespace: "team", Key: first.Key, Task: r.Task, Operation: r.Operation, Target: r.Target,
		Holder: "raw", RequestDigest: r.RequestDigest, TTL: 60e9, Redispatch: true,
	})
	require.NoError(t, err)
	require.Equal(t, ledger.UnknownOutcome, res.Decision, "charge is not declared upstream-idempotent on this server")
	res, err = raw.Reserve(ctx, ledger.ReserveParams{
		Namespace: "team", Key: first.Key, Task: r.Task, Operation: r.Operation, Target: r.Target,
		Holder: "raw", RequestDigest: r.RequestDigest, TTL: 60e9, Supersede: first.Token,
	})
	require.NoError(t, err)
	require.Equal(t, ledger.UnknownOutcome, res.Decision, "a new intent supersedes a success, never an unknown outcome")
	got, err := raw.Get(ctx, ledger.GetParams{Namespace: "team", Key: first.Key})
	require.NoError(t, err)
	require.Equal(t, 1, got.AttemptCount, "one attempt, one dispatch")
}

// TestLedgerProtocolRedispatchesDeclaredOperations: with --upstream-idempotent charge, a
// granted token's reserve of charge re-dispatches over its unknown outcome (attempt 2 under
// a new token), as an interceptor whose operation is declared so expects.
func TestLedgerProtocolRedispatchesDeclaredOperations(t *testing.T) {
	t.Parallel()
	_, url, _ := teamServe(t, "--upstream-idempotent", "charge")
	base := strings.TrimSuffix(url, mcpwire.Path)
	ctx := t.Context()
	raw, err := remote.New(base, remote.Options{Token: ledgerToken})
	require.NoError(t, err)
	defer raw.Close()
	p := ledger.ReserveParams{
		Namespace: "team", Key: residual.Key("team", "t", "charge", "invoice:1"), Task: "t", Operation: "charge",
		Target: "invoice:1", Holder: "worker", RequestDigest: "d", TTL: 60e9, Redispatch: true,
	}
	res, err := raw.Reserve(ctx, p)
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, res.Decision)
	_, err = raw.Commit(ctx, ledger.CommitParams{Namespace: "team", Key: p.Key, Holder: "worker", Token: res.Lease.Token, Outcome: residual.Unknown})
	require.NoError(t, err, "the reserving client commits its own attempt")
	again, err := raw.Reserve(ctx, p)
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, again.Decision)
	require.Greater(t, again.Lease.Token, res.Lease.Token)
}
