package mcpserver_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// begun is what a test keeps of a begin_call result.
type begun struct {
	Decision    string             `json:"decision"`
	Key         string             `json:"key"`
	Token       uint64             `json:"token"`
	Holder      string             `json:"holder"`
	LeaseSecret string             `json:"lease_secret"`
	Violation   *mcpwire.Violation `json:"violation"`
}

func beginOn(t *testing.T, c *client.Client, target string) begun {
	t.Helper()
	return ok[begun](t, c, "begin_call", m{"task": "fence", "operation": "charge", "target": target, "args": m{"amount": 1}, "holder": "agent-A", "lease_ms": 60000})
}

// commitArgs are commit_call arguments under b's key, token and secret, plus extra.
func commitArgs(b begun, outcome string, extra m) m {
	args := m{"key": b.Key, "token": b.Token, "outcome": outcome, "lease_secret": b.LeaseSecret}
	for k, v := range extra {
		args[k] = v
	}
	return args
}

func holderHash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])[:32]
}

// TestLeaseSecretFencesCommitAndRenew: tokens are small and visible to every client of the
// namespace, so commit_call and renew_lease need the lease_secret that only begin_call's
// caller received. Another client holding the token but not the secret can neither settle
// the attempt (which would let a second begin_call dispatch again) nor extend it; the
// refusals write nothing, and the holder then commits normally.
func TestLeaseSecretFencesCommitAndRenew(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	a := e.dial(tokA, legacy)
	other := e.dial(tokA, modern) // same namespace, same bearer token: only the secret tells them apart
	b := beginOn(t, a, "invoice:1")
	require.Equal(t, mcpserver.DecisionProceed, b.Decision)
	before := snapshot(t, e.led, nsA)

	// The reproduction: a third party commits A's attempt as failed with the visible token.
	info := fails(t, other, "commit_call", m{"key": b.Key, "token": b.Token, "outcome": "failed"})
	require.Equal(t, mcpwire.KindInvalidInput, info.Kind)
	require.Contains(t, info.Message, "lease_secret is required")
	require.Equal(t, before, snapshot(t, e.led, nsA), "a commit without the secret writes nothing")
	next := beginOn(t, other, "invoice:1")
	require.Equal(t, mcpserver.DecisionBlocked, next.Decision, "A's call is still in flight: no second dispatch")
	require.Equal(t, interceptor.Kind("in_progress"), next.Violation.Kind)

	// begin_call handed A a 128-bit secret; the stored holder carries only its hash.
	require.Regexp(t, `^[0-9a-f]{32}$`, b.LeaseSecret)
	require.Equal(t, "agent-A#"+holderHash(b.LeaseSecret), b.Holder)

	wrong := strings.Repeat("0", 32)
	for _, tc := range []struct {
		tool string
		args m
		kind string
		want string
	}{
		{"commit_call", m{"key": b.Key, "token": b.Token, "outcome": "failed", "lease_secret": wrong}, "lease_lost", "lease_secret does not match"},
		{"commit_call", m{"key": b.Key, "token": b.Token, "outcome": "succeeded", "upstream_status": 200, "lease_secret": wrong}, "lease_lost", "lease_secret does not match"},
		{"commit_call", m{"key": b.Key, "token": b.Token, "outcome": "failed", "lease_secret": "not-hex"}, "invalid_input", "32 lowercase hex"},
		{"commit_call", m{"key": b.Key, "token": b.Token, "outcome": "failed", "lease_secret": strings.ToUpper(b.LeaseSecret)}, "invalid_input", "32 lowercase hex"},
		{"renew_lease", m{"key": b.Key, "token": b.Token, "lease_ms": 120000}, "invalid_input", "lease_secret is required"},
		{"renew_lease", m{"key": b.Key, "token": b.Token, "lease_ms": 120000, "lease_secret": wrong}, "lease_lost", "lease_secret does not match"},
		// The right secret under another token (here one never issued) is no better.
		{"commit_call", m{"key": b.Key, "token": b.Token + 1, "outcome": "failed", "lease_secret": b.LeaseSecret}, "lease_lost", "never issued"},
	} {
		info := fails(t, other, tc.tool, tc.args)
		require.Equal(t, mcpwire.Kind(tc.kind), info.Kind, "%s %v: %s", tc.tool, tc.args, info.Message)
		require.Contains(t, info.Message, tc.want, "%s %v", tc.tool, tc.args)
		require.NotContains(t, info.Message, wrong, "a given secret is never echoed")
		require.Equal(t, before, snapshot(t, e.led, nsA), "%s %v changed the ledger", tc.tool, tc.args)
	}

	// The secret is never shown to readers of the ledger.
	for _, res := range []string{
		text(callTool(t, other, "list_pending", m{})),
		text(callTool(t, other, "inspect_residual", m{"key": b.Key})),
		text(callTool(t, other, "begin_call", m{"task": "fence", "operation": "charge", "target": "invoice:1", "args": m{"amount": 1}})),
	} {
		require.NotContains(t, res, b.LeaseSecret)
		require.Contains(t, res, "agent-A#"+holderHash(b.LeaseSecret))
	}

	// A, with its secret, renews and commits.
	ok[mcpserver.RenewResult](t, a, "renew_lease", m{"key": b.Key, "token": b.Token, "lease_ms": 120000, "lease_secret": b.LeaseSecret})
	cm := ok[mcpserver.CommitResult](t, a, "commit_call", commitArgs(b, "succeeded", m{"result": m{"charge": "ch_1"}, "upstream_status": 200}))
	require.Equal(t, residual.Succeeded, cm.State)
	rp := beginOn(t, other, "invoice:1")
	require.Equal(t, mcpserver.DecisionReplay, rp.Decision)
	require.Empty(t, rp.LeaseSecret, "only proceed hands out a secret")

	// Two begin_calls by one holder name get different secrets, and one does not fit the other.
	b2 := beginOn(t, a, "invoice:2")
	b3 := beginOn(t, a, "invoice:3")
	require.NotEqual(t, b2.LeaseSecret, b3.LeaseSecret)
	require.Equal(t, mcpwire.KindLeaseLost, fails(t, a, "commit_call", m{"key": b2.Key, "token": b2.Token, "outcome": "failed", "lease_secret": b3.LeaseSecret}).Kind)
	require.Equal(t, residual.Failed, ok[mcpserver.CommitResult](t, a, "commit_call", commitArgs(b2, "failed", m{"upstream_status": 422})).State)

	// Without a holder input the name is derived from the client, still with the hash.
	b4 := ok[begun](t, a, "begin_call", m{"task": "fence", "operation": "charge", "target": "invoice:4", "args": m{}})
	require.Regexp(t, regexp.MustCompile(`^mcp:test-agent:[0-9a-f]{8}#`+holderHash(b4.LeaseSecret)+`$`), b4.Holder)
}

// TestCommitClassifiesTheStatus: the outcome an agent claims is checked against what the
// upstream status says, not the other way round. A claim is recorded when it matches, or
// when it is more cautious (accepted or unknown for a success; unknown always); anything
// else is refused with the outcome the status implies, and the residual stays pending.
func TestCommitClassifiesTheStatus(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	c := e.dial(tokA, legacy)
	cases := []struct {
		outcome string
		status  int
		body    any
		implied string // "" when the claim is recorded
	}{
		{"failed", 503, nil, "unknown"},
		{"failed", 500, nil, "unknown"},
		{"failed", 408, nil, "unknown"},
		{"failed", 409, nil, "unknown"},
		{"failed", 429, nil, "unknown"},
		{"succeeded", 500, nil, "unknown"},
		{"succeeded", 503, nil, "unknown"},
		{"succeeded", 429, nil, "unknown"},
		{"succeeded", 422, nil, "failed"},
		{"succeeded", 202, nil, "accepted"},
		{"failed", 202, nil, "accepted"},
		{"failed", 200, nil, "succeeded"},
		{"accepted", 503, nil, "unknown"},
		{"accepted", 422, nil, "failed"},
		{"failed", 200, m{"status": "queued"}, "accepted"},
		{"unknown", 200, nil, ""},
		{"unknown", 503, nil, ""},
		{"unknown", 202, nil, ""},
		{"unknown", 422, nil, ""},
		{"failed", 422, nil, ""},
		{"failed", 404, nil, ""},
		{"succeeded", 200, nil, ""},
		{"succeeded", 201, nil, ""},
		{"accepted", 202, nil, ""},
		{"accepted", 200, nil, ""}, // more cautious than the success the status implies
		// Without a status the claim is all there is to check (a queued body aside).
		{"failed", 0, nil, ""},
		{"succeeded", 0, nil, ""},
		{"succeeded", 0, m{"status": "pending"}, "accepted"},
	}
	for i, tc := range cases {
		name := fmt.Sprintf("%s+%d", tc.outcome, tc.status)
		b := beginOn(t, c, fmt.Sprintf("invoice:%d", i))
		require.Equal(t, mcpserver.DecisionProceed, b.Decision, name)
		extra := m{}
		if tc.status != 0 {
			extra["upstream_status"] = tc.status
		}
		if tc.body != nil {
			extra["upstream_body"] = tc.body
		}
		args := commitArgs(b, tc.outcome, extra)
		if tc.implied == "" {
			cm := ok[mcpserver.CommitResult](t, c, "commit_call", args)
			require.Equal(t, residual.State(tc.outcome), cm.State, name)
			continue
		}
		before := snapshot(t, e.led, nsA)
		info := fails(t, c, "commit_call", args)
		require.Equal(t, mcpwire.KindRefused, info.Kind, "%s: %s", name, info.Message)
		require.Contains(t, info.Message, "outcome "+tc.outcome+" refused", name)
		require.Contains(t, info.Recovery, "outcome="+tc.implied, name)
		if tc.status != 0 && tc.status != 202 && tc.body == nil {
			require.Contains(t, info.Message, fmt.Sprintf("upstream status %d implies %s", tc.status, tc.implied), name)
		}
		require.Equal(t, before, snapshot(t, e.led, nsA), "%s: a refused commit changes nothing", name)
		// Still in flight: no second dispatch.
		again := beginOn(t, c, fmt.Sprintf("invoice:%d", i))
		require.Equal(t, mcpserver.DecisionBlocked, again.Decision, name)
		require.Equal(t, interceptor.Kind("in_progress"), again.Violation.Kind, name)
	}

	// The reproduction: failed + 503 is refused; committed as unknown, the key then blocks
	// instead of proceeding to a duplicate dispatch.
	b := beginOn(t, c, "invoice:503")
	require.Equal(t, mcpwire.KindRefused, fails(t, c, "commit_call", commitArgs(b, "failed", m{"upstream_status": 503})).Kind)
	require.Equal(t, residual.Unknown, ok[mcpserver.CommitResult](t, c, "commit_call", commitArgs(b, "unknown", m{"upstream_status": 503})).State)
	next := beginOn(t, c, "invoice:503")
	require.Equal(t, mcpserver.DecisionBlocked, next.Decision)
	require.Equal(t, interceptor.Kind("unknown_outcome"), next.Violation.Kind)
}

// failingWatcher is a ledger whose change stream fails on its first subscription.
type failingWatcher struct {
	ledger.Ledger
	w     ledger.Watcher
	calls atomic.Int32
	seen  chan int32
}

func (f *failingWatcher) Watch(ctx context.Context, ns string) (<-chan ledger.Change, error) {
	n := f.calls.Add(1)
	f.seen <- n
	if n == 1 {
		return nil, errors.New("watch unavailable")
	}
	return f.w.Watch(ctx, ns)
}

// TestWatchRetryUsesTheClock: after a failed subscription the watcher waits on the
// injected clock before it tries again.
func TestWatchRetryUsesTheClock(t *testing.T) {
	t.Parallel()
	clock := lease.NewFake(t0)
	led, err := badger.Open(t.TempDir(), badger.Options{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, led.Close()) })
	fw := &failingWatcher{Ledger: led, w: led, seen: make(chan int32, 4)}
	ic, err := interceptor.New(fw, interceptor.Options{Namespace: nsA, Clock: clock})
	require.NoError(t, err)
	srv, err := mcpserver.New(ic, mcpserver.Options{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	_, err = srv.MCPServer(nsA)
	require.NoError(t, err)

	await := func(want int32) {
		t.Helper()
		select {
		case n := <-fw.seen:
			require.Equal(t, want, n)
		case <-time.After(10 * time.Second):
			t.Fatalf("no watch call %d", want)
		}
	}
	await(1)
	// Two waiters: the session sweeper (started by New, on the same clock) and the retry.
	// Waiting for one let the sweeper stand in for the retry, and the retry then registered
	// after Advance, on a deadline that never came ("no watch call 2").
	waiting := make(chan struct{})
	go func() {
		clock.BlockUntil(2)
		close(waiting)
	}()
	select {
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the retry does not wait on the injected clock")
	}
	require.Empty(t, fw.seen, "no retry before the clock moves")
	clock.Advance(time.Second)
	await(2)
}

// TestLeaseSecretSchema: commit_call and renew_lease declare lease_secret as required, and
// begin_call's output schema has it.
func TestLeaseSecretSchema(t *testing.T) {
	t.Parallel()
	c := setup(t, nil).dial(tokA, legacy)
	tools, err := c.ListTools(ctx(t), mcp.ListToolsRequest{})
	require.NoError(t, err)
	for _, tl := range tools.Tools {
		raw, err := json.Marshal(tl)
		require.NoError(t, err)
		var w struct {
			InputSchema struct {
				Required   []string `json:"required"`
				Properties map[string]struct {
					Type    string `json:"type"`
					Pattern string `json:"pattern"`
				} `json:"properties"`
			} `json:"inputSchema"`
			OutputSchema struct {
				Properties map[string]any `json:"properties"`
			} `json:"outputSchema"`
		}
		require.NoError(t, json.Unmarshal(raw, &w))
		switch tl.Name {
		case "commit_call", "renew_lease":
			require.Contains(t, w.InputSchema.Required, "lease_secret", tl.Name)
			require.Equal(t, "^[0-9a-f]{32}$", w.InputSchema.Properties["lease_secret"].Pattern, tl.Name)
			require.Contains(t, tl.Description, "lease_secret", tl.Name)
		case "begin_call":
			require.Contains(t, w.OutputSchema.Properties, "lease_secret")
			require.Contains(t, tl.Description, "lease_secret")
		}
	}
}

// commit_call stores a result the way the interceptor does: through its redactor, with the
// digest of the whole result.
func TestCommitRedactsTheResult(t *testing.T) {
	t.Parallel()
	e := setupWith(t, interceptor.Options{
		Redact: func(op string, b []byte) []byte { return []byte(`{"card":"[redacted]"}`) },
	}, nil)
	c := e.dial(tokA, legacy)
	b := beginOn(t, c, "invoice:redact")
	require.Equal(t, mcpserver.DecisionProceed, b.Decision)
	ok[mcpserver.CommitResult](t, c, "commit_call", commitArgs(b, "succeeded", m{"result": m{"card": "4242"}}))
	r, err := e.led.Get(ctx(t), ledger.GetParams{Namespace: nsA, Key: b.Key})
	require.NoError(t, err)
	require.JSONEq(t, `{"card":"[redacted]"}`, string(r.Result))
	require.NotContains(t, string(r.Result), "4242")
}
