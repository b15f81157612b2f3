package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/residual"
)

// TestPolicyRegisteredOnTheInterceptor: an operation registered on the interceptor (not in
// Options.Operations) is the policy of begin_call too, in every namespace: an
// upstream-idempotent operation re-dispatches an unknown attempt over MCP as through Do.
func TestPolicyRegisteredOnTheInterceptor(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	require.NoError(t, e.ic.Register("charge.idem", interceptor.Operation{UpstreamIdempotent: true}))
	for _, tok := range []string{tokA, tokB} {
		c := e.dial(tok, legacy)
		args := m{"task": "t", "operation": "charge.idem", "target": "invoice:1", "args": m{"amount": 1}}
		b := ok[begun](t, c, "begin_call", args)
		require.Equal(t, mcpserver.DecisionProceed, b.Decision)
		ok[mcpserver.CommitResult](t, c, "commit_call", commitArgs(b, "unknown", m{"upstream_status": 503}))
		again := ok[begun](t, c, "begin_call", args)
		require.Equal(t, mcpserver.DecisionProceed, again.Decision, "token %s: an unknown attempt of an upstream-idempotent operation is re-dispatched", tok)
		require.Equal(t, b.Key, again.Key)
		require.Greater(t, again.Token, b.Token)
	}
}

// redactingCap masks card numbers and caps results at 24 bytes.
func redactingCap() interceptor.Config {
	return interceptor.Config{
		MaxResult: 24,
		Redact:    func(_ string, b []byte) []byte { return bytes.ReplaceAll(b, []byte("4242"), []byte("****")) },
	}
}

const secretResult = `{"card":"4242","note":"0123456789012345678901234567890123456789"}`

func requireStoredRedactedCapped(t *testing.T, l ledger.Ledger, key string) {
	t.Helper()
	r, err := l.Get(context.Background(), ledger.GetParams{Namespace: nsA, Key: key})
	require.NoError(t, err)
	require.NotContains(t, string(r.Result), "4242")
	require.True(t, strings.HasPrefix(string(r.Result), `{"card":"****"`), string(r.Result))
	require.Len(t, r.Result, 24)
	require.True(t, r.ResultTruncated)
}

// TestCommitAndResolveStoreRedactedCapped: commit_call and resolve_residual store results
// the way Do does: redacted, then capped.
func TestCommitAndResolveStoreRedactedCapped(t *testing.T) {
	t.Parallel()
	e := setupWith(t, redactingCap(), nil)
	c := e.dial(tokA, legacy)

	b := beginOn(t, c, "invoice:commit")
	cm := ok[mcpserver.CommitResult](t, c, "commit_call", commitArgs(b, "succeeded", m{"result": json.RawMessage(secretResult)}))
	require.True(t, cm.ResultTruncated)
	requireStoredRedactedCapped(t, e.led, b.Key)

	b = beginOn(t, c, "invoice:resolve")
	ok[mcpserver.CommitResult](t, c, "commit_call", commitArgs(b, "unknown", nil))
	ok[mcpserver.ResolveResult](t, c, "resolve_residual", m{"key": b.Key, "as": "succeeded", "note": "found it upstream", "result": json.RawMessage(secretResult)})
	requireStoredRedactedCapped(t, e.led, b.Key)
	rp := ok[begun](t, c, "begin_call", m{"task": "fence", "operation": "charge", "target": "invoice:resolve", "args": m{"amount": 1}})
	require.Equal(t, mcpserver.DecisionReplay, rp.Decision)
}

// TestErrorKindsAreOneVocabulary: the wire's error kinds that name violations are the
// interceptor's kind names.
func TestErrorKindsAreOneVocabulary(t *testing.T) {
	t.Parallel()
	require.Equal(t, string(interceptor.LeaseLost), mcpserver.KindLeaseLost)
	require.Equal(t, "lease_lost", mcpserver.KindLeaseLost)
	require.Equal(t, string(interceptor.InProgress), mcpserver.KindInProgress)
	require.Equal(t, interceptor.LeaseLost, interceptor.LeasePreempted, "the old Go name is an alias")
	require.ErrorIs(t, interceptor.LeaseLost.Sentinel(), residual.ErrLeaseLost)
}
