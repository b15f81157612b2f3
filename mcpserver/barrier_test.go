package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
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
func redactingCap() interceptor.Options {
	return interceptor.Options{
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
	require.Equal(t, mcpwire.Kind(interceptor.LeaseLost), mcpwire.KindLeaseLost)
	require.Equal(t, mcpwire.Kind("lease_lost"), mcpwire.KindLeaseLost)
	require.Equal(t, mcpwire.Kind(interceptor.InProgress), mcpwire.KindInProgress)
	require.ErrorIs(t, interceptor.LeaseLost.Sentinel(), residual.ErrLeaseLost)
}

// TestKeyFieldsMustBeValidUTF8: "\xff", "\xfe" and a lone surrogate escape would all decode
// to U+FFFD and derive one key (replaying each other's results); they are refused before
// anything is written, while a real U+FFFD is a target like any other.
func TestKeyFieldsMustBeValidUTF8(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	c := e.dial(tokA, legacy)
	before := snapshot(t, e.led, nsA)
	for _, target := range []string{"\"inv\xff\"", "\"inv\xfe\"", `"inv\udcff"`} {
		info := fails(t, c, "begin_call", json.RawMessage(`{"task":"t","operation":"charge","target":`+target+`,"args":{}}`))
		require.Equal(t, mcpwire.KindInvalidInput, info.Kind, target)
		require.Contains(t, info.Message, "UTF", target)
	}
	require.Equal(t, before, snapshot(t, e.led, nsA), "nothing was written")
	b := ok[begun](t, c, "begin_call", json.RawMessage(`{"task":"t","operation":"charge","target":"inv\ufffd","args":{}}`))
	require.Equal(t, mcpserver.DecisionProceed, b.Decision)
}

// TestNumbersAsClientsSendThem: lease_ms 1000.0 (a float-computing client) is a lease of one
// second; 1000.5 is refused naming the field; upstream_status outside 100-599 is refused.
func TestNumbersAsClientsSendThem(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	c := e.dial(tokA, legacy)
	b := ok[mcpserver.BeginResult](t, c, "begin_call", json.RawMessage(`{"task":"t","operation":"o","target":"x","args":{},"lease_ms":1000.0}`))
	require.Equal(t, mcpserver.DecisionProceed, b.Decision)
	require.EqualValues(t, 1000, b.LeaseMS)
	info := fails(t, c, "begin_call", json.RawMessage(`{"task":"t","operation":"o","target":"y","args":{},"lease_ms":1000.5}`))
	require.Contains(t, info.Message, `field "lease_ms" must be an integer, got number 1000.5`)
	for _, st := range []int{1, 99, 600, 999} {
		info := fails(t, c, "commit_call", m{"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "outcome": "unknown", "upstream_status": st})
		require.Equal(t, mcpwire.KindInvalidInput, info.Kind, st)
		require.Contains(t, info.Message, "100 to 599", st)
	}
}

// TestLeaseMSSchemaIsAnInteger: the reflected schema of lease_ms stays an integer.
func TestLeaseMSSchemaIsAnInteger(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	c := e.dial(tokA, legacy)
	tools, err := c.ListTools(ctx(t), mcp.ListToolsRequest{})
	require.NoError(t, err)
	for _, tl := range tools.Tools {
		if tl.Name != mcpserver.ToolBegin && tl.Name != mcpserver.ToolRenew {
			continue
		}
		wire, err := json.Marshal(tl)
		require.NoError(t, err)
		var s struct {
			InputSchema struct {
				Properties map[string]struct {
					Type string `json:"type"`
				} `json:"properties"`
			} `json:"inputSchema"`
		}
		require.NoError(t, json.Unmarshal(wire, &s), tl.Name)
		require.Equal(t, "integer", s.InputSchema.Properties["lease_ms"].Type, tl.Name)
	}
}

// TestClientNameIsCappedAndCleaned: the client's self-reported name becomes part of a
// holder, an audit's "by" and reconcile's actor; a 1 MiB name with control characters
// reaches the ledger as at most 64 printable bytes.
func TestClientNameIsCappedAndCleaned(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	tr, err := transport.NewStreamableHTTP(e.url, transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + tokA}))
	require.NoError(t, err)
	c := client.NewClient(tr, client.WithProtocolVersion(legacy))
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() { c.Close() })
	var init mcp.InitializeRequest
	init.Params.ClientInfo = mcp.Implementation{Name: "evil\x1b]0;pwned\x07\n" + strings.Repeat("A", 1<<20), Version: "1"}
	_, err = c.Initialize(ctx(t), init)
	require.NoError(t, err)

	b := ok[begun](t, c, "begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}})
	require.Equal(t, mcpserver.DecisionProceed, b.Decision)
	require.LessOrEqual(t, len(b.Holder), len("mcp:")+64+len(":01234567#")+32)
	require.NotContains(t, b.Holder, "\x1b")
	require.NotContains(t, b.Holder, "\n")
	require.True(t, strings.HasPrefix(b.Holder, "mcp:evil]0;pwned"), b.Holder)
}
