package interop_test

import (
	"context"
	"errors"
	"io"
	"net/url"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/fixture/mcpfixture"
	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// Kinds of the proxy's _meta error details the cells expect.
const (
	kindUnknown    = "unknown_outcome"
	kindInProgress = "in_progress"
	kindMismatch   = "payload_mismatch"
	kindAwaiting   = "awaiting_upstream"
	kindPolicy     = "policy"
)

func mode(m string) map[string]any { return map[string]any{mcpfixture.MetaMode: m} }

// untilRefused calls append with args until the proxy refuses it as want, allowing
// in_progress refusals before (a lease that has not expired yet, a report not yet written);
// it fails the test on any other answer or after 20 s. Nothing is dispatched meanwhile
// (checked by the callers' dispatch counts).
func untilRefused(t *testing.T, h *goHost, want string) outcome {
	t.Helper()
	return untilCallRefused(t, h, mcpfixture.ToolAppend, args, want)
}

// untilCallRefused is untilRefused for a call of tool with callArgs.
func untilCallRefused(t *testing.T, h *goHost, tool string, callArgs map[string]any, want string) outcome {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		o := h.call(t, tool, callArgs, nil)
		require.True(t, o.IsError, "a blocked key answers isError: %s", o.Raw)
		if o.Kind == want {
			return o
		}
		require.Equal(t, kindInProgress, o.Kind, "only in_progress may come before %s: %s", want, o.Raw)
		require.True(t, time.Now().Before(deadline), "still in_progress after 20 s: %s", o.Raw)
		time.Sleep(50 * time.Millisecond) // a lease expiry is a matter of time: poll the refusal
	}
}

// requireResidual checks the store's one residual (the proxies must have exited).
func requireResidual(t *testing.T, w *world, state residual.State) {
	t.Helper()
	rs := w.residuals()
	require.Len(t, rs, 1)
	require.Equal(t, "fx/append", rs[0].Operation)
	require.Equal(t, state, rs[0].State)
}

// TestRestartedProxyReplays: a call made through a proxy replays through a new proxy
// process (and a new host session) on the same store: the default task is stable across
// restarts. Go SDK and mcp-go hosts × both upstreams.
func TestRestartedProxyReplays(t *testing.T) {
	t.Parallel()
	for hk, newHost := range hostKinds {
		for _, fx := range fixtures {
			t.Run("host="+hk+"/upstream="+fx, func(t *testing.T) {
				t.Parallel()
				w := setup(t, fx, "")
				h := newHost(w, w.proxyArgv(w.store))
				first := h.call(t, mcpfixture.ToolAppend, args, nil)
				require.NoError(t, h.close())
				h = newHost(w, w.proxyArgv(w.store))
				requireReplayOf(t, first, h.call(t, mcpfixture.ToolAppend, args, nil))
				require.NoError(t, h.close())
				require.Equal(t, 1, w.effectCount())
				requireResidual(t, w, residual.Succeeded)
			})
		}
	}
}

// TestProxyKilledAfterTheEffect: the upstream SIGKILLs the proxy after its effect and before
// any answer. A new proxy on the store refuses the call as an unknown outcome (once the dead
// proxy's lease is over) and sends nothing upstream: effects = 1.
func TestProxyKilledAfterTheEffect(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, "")
			w.flags = []string{"--lease", "1s"}
			h := w.goSDK(w.proxyArgv(w.store))
			_, err := h.callErr(t.Context(), mcpfixture.ToolAppend, args, mode(mcpfixture.ModeKillParent))
			require.Error(t, err, "the proxy died: the host gets no answer")
			_ = h.close()
			require.Equal(t, 1, w.effectCount())

			h = w.goSDK(w.proxyArgv(w.store))
			o := untilRefused(t, h, kindUnknown)
			require.Contains(t, o.text(), "outcome unknown")
			require.NoError(t, h.close())
			require.Equal(t, 1, w.effectCount())
			require.Equal(t, 1, w.dispatchCount())
			requireResidual(t, w, residual.Unknown)
		})
	}
}

// TestUpstreamCrashAfterTheEffect: the upstream exits after its effect without answering:
// the host gets unknown_outcome, and the call through a new proxy is refused, not sent.
func TestUpstreamCrashAfterTheEffect(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, "")
			h := w.goSDK(w.proxyArgv(w.store))
			o := h.call(t, mcpfixture.ToolAppend, args, mode(mcpfixture.ModeCrash))
			require.True(t, o.IsError)
			require.Equal(t, kindUnknown, o.Kind, o.Raw)
			_ = h.close()

			h = w.goSDK(w.proxyArgv(w.store))
			o = h.call(t, mcpfixture.ToolAppend, args, nil)
			require.Equal(t, kindUnknown, o.Kind, o.Raw)
			require.NoError(t, h.close())
			require.Equal(t, 1, w.effectCount())
			require.Equal(t, 1, w.dispatchCount())
			requireResidual(t, w, residual.Unknown)
		})
	}
}

// TestUpstreamHangsPastTimeout: no answer within --timeout → unknown; the next call is
// refused and not sent.
func TestUpstreamHangsPastTimeout(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, "")
			w.flags = []string{"--timeout", "1s"}
			h := w.goSDK(w.proxyArgv(w.store))
			o := h.call(t, mcpfixture.ToolAppend, args, mode(mcpfixture.ModeHang))
			require.True(t, o.IsError)
			require.Equal(t, kindUnknown, o.Kind, o.Raw)
			o = h.call(t, mcpfixture.ToolAppend, args, nil)
			require.Equal(t, kindUnknown, o.Kind, o.Raw)
			require.NoError(t, h.close())
			require.Equal(t, 1, w.effectCount())
			require.Equal(t, 1, w.dispatchCount())
		})
	}
}

// TestHostCancelsAfterTheEffect: the host cancels (notifications/cancelled) a call the
// upstream is acting on: the proxy does not cut it off (that would leave its outcome
// unknown); the host's retry is refused in_progress while it runs, and once upstream
// answered it is answered from the ledger: one dispatch, one effect, succeeded.
func TestHostCancelsAfterTheEffect(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, "")
			w.fifos()
			h := w.goSDK(w.proxyArgv(w.store))
			cancelAfterTheEffect(t, w, h, nil)
			require.NoError(t, h.close())
			requireResidual(t, w, residual.Succeeded)
		})
	}
}

// cancelAfterTheEffect has h call append in ModeGate, cancels the call once the fixture
// acted, retries (refused in_progress while the call runs), waits for seen (when not nil)
// to see that the proxy knows the host stopped waiting, releases the fixture, and checks
// the next retry is answered from the ledger as a retry, with one effect.
func cancelAfterTheEffect(t *testing.T, w *world, h *goHost, seen func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := h.callErr(ctx, mcpfixture.ToolAppend, args, mode(mcpfixture.ModeGate))
		done <- err
	}()
	w.awaitEntered()
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	busy := h.call(t, mcpfixture.ToolAppend, args, nil)
	require.Equal(t, kindInProgress, busy.Kind, "the cancelled call still runs upstream: %s", busy.Raw)
	if seen != nil {
		seen()
	}
	w.release()
	deadline := time.Now().Add(20 * time.Second)
	for {
		o := h.call(t, mcpfixture.ToolAppend, args, nil)
		if !o.IsError {
			require.True(t, o.Replayed, o.Raw)
			require.Contains(t, o.text(), "its earlier answer may not have reached the host")
			require.Equal(t, "appended hello to inbox:bob", o.Texts[len(o.Texts)-1])
			break
		}
		require.Equal(t, kindInProgress, o.Kind, "only in_progress may come before the replay: %s", o.Raw)
		require.True(t, time.Now().Before(deadline), "still in_progress after 20 s: %s", o.Raw)
		time.Sleep(50 * time.Millisecond) // the released call is being recorded
	}
	require.Equal(t, 1, w.effectCount())
	require.Equal(t, 1, w.dispatchCount())
}

// TestTwentyConcurrentIdenticalCalls: 20 identical calls at once through one proxy: one
// reaches the upstream (held there until the others have been answered), the 19 others are
// refused in_progress; a call after it replays.
func TestTwentyConcurrentIdenticalCalls(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, "")
			w.fifos()
			w.setMode(mcpfixture.ModeGate)
			h := w.goSDK(w.proxyArgv(w.store))
			results := make(chan outcome, 20)
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() {
					o, err := h.callErr(t.Context(), mcpfixture.ToolAppend, args, nil)
					if err != nil {
						o = outcome{Texts: []string{"protocol error: " + err.Error()}, IsError: true}
					}
					results <- o
				})
			}
			w.awaitEntered()
			for range 19 {
				o := <-results
				require.True(t, o.IsError, o.Raw)
				require.Equal(t, kindInProgress, o.Kind, "%s", o.Raw)
			}
			w.release()
			wg.Wait()
			first := <-results
			w.setMode(mcpfixture.ModeOK)
			requireReplayOf(t, first, h.call(t, mcpfixture.ToolAppend, args, nil))
			require.Equal(t, 1, w.effectCount())
			require.Equal(t, 1, w.dispatchCount())
		})
	}
}

// TestRewordedCallOnTheSameTarget: with a target pointer, other arguments on the same
// target are refused as a payload mismatch and not sent.
func TestRewordedCallOnTheSameTarget(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, `{"tools": {"append": {"target": ["/target"]}}}`)
			h := w.goSDK(w.proxyArgv(w.store))
			require.False(t, h.call(t, mcpfixture.ToolAppend, args, nil).IsError)
			o := h.call(t, mcpfixture.ToolAppend, map[string]any{"target": "inbox:bob", "text": "hello there, Bob"}, nil)
			require.True(t, o.IsError)
			require.Equal(t, kindMismatch, o.Kind, o.Raw)
			require.Contains(t, o.text(), "with different arguments; it was not repeated")
			require.Equal(t, 1, w.effectCount())
			require.Equal(t, 1, w.dispatchCount())
		})
	}
}

// TestIsErrorWithoutNoEffectRule: an isError answer after an effect, with no rule proving
// nothing happened, is unknown: the retry is refused, not sent.
func TestIsErrorWithoutNoEffectRule(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, `{"tools": {"append": {"target": ["/target"], "no_effect": {"patterns": ["^rejected:"]}}}}`)
			h := w.goSDK(w.proxyArgv(w.store))
			o := h.call(t, mcpfixture.ToolAppend, args, mode(mcpfixture.ModeIsError))
			require.True(t, o.IsError)
			require.Equal(t, kindUnknown, o.Kind, o.Raw)
			require.Contains(t, o.text(), "boom after the write", "upstream's own text follows the observation")
			o = h.call(t, mcpfixture.ToolAppend, args, nil)
			require.Equal(t, kindUnknown, o.Kind, o.Raw)
			require.NoError(t, h.close())
			require.Equal(t, 1, w.effectCount())
			require.Equal(t, 1, w.dispatchCount())
			requireResidual(t, w, residual.Unknown)
		})
	}
}

// TestIsErrorMatchingNoEffectRule: an isError answer matching a no_effect pattern is failed:
// the host gets upstream's answer untouched, and the retry is sent and acts.
func TestIsErrorMatchingNoEffectRule(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, `{"tools": {"append": {"target": ["/target"], "no_effect": {"patterns": ["^rejected:"]}}}}`)
			h := w.goSDK(w.proxyArgv(w.store))
			o := h.call(t, mcpfixture.ToolAppend, args, mode(mcpfixture.ModeReject))
			require.True(t, o.IsError)
			require.Empty(t, o.Kind, "upstream's own answer: %s", o.Raw)
			require.Equal(t, []string{"rejected: the mailbox is full, nothing was sent"}, o.Texts)
			o = h.call(t, mcpfixture.ToolAppend, args, nil)
			require.False(t, o.IsError, o.Raw)
			require.False(t, o.Replayed)
			require.NoError(t, h.close())
			require.Equal(t, 1, w.effectCount())
			require.Equal(t, 2, w.dispatchCount())
			requireResidual(t, w, residual.Succeeded)
		})
	}
}

// TestInvalidParamsIsFailedAndRetried: a JSON-RPC invalid params answer (-32602) means the
// call never ran: the host gets the error, and the retry is sent and acts. (Go SDK upstream:
// an mcp-go tool cannot answer -32602; see TestUnknownToolIsFailedAndRetried for both.)
func TestInvalidParamsIsFailedAndRetried(t *testing.T) {
	t.Parallel()
	w := setup(t, "gosdk", "")
	h := w.goSDK(w.proxyArgv(w.store))
	_, err := h.callErr(t.Context(), mcpfixture.ToolAppend, args, mode(mcpfixture.ModeInvalid))
	var we *jsonrpc.Error
	require.ErrorAs(t, err, &we)
	require.EqualValues(t, jsonrpc.CodeInvalidParams, we.Code)
	require.Contains(t, we.Message, "priority must be 0 to 9")
	o := h.call(t, mcpfixture.ToolAppend, args, nil)
	require.False(t, o.IsError, o.Raw)
	require.False(t, o.Replayed)
	require.NoError(t, h.close())
	require.Equal(t, 1, w.effectCount())
	require.Equal(t, 2, w.dispatchCount())
	rs := w.residuals()
	require.Len(t, rs, 1)
	require.Len(t, rs[0].Attempts, 2)
	require.Equal(t, residual.Failed, rs[0].Attempts[0].Outcome)
	require.Equal(t, residual.Succeeded, rs[0].State)
}

// TestUnknownToolRefusedUnreserved: a tool the upstream does not list (the proxy has read
// its tools/list) is answered with the spec's JSON-RPC error -32602 naming the tool, every
// time, with nothing reserved: the store holds nothing for it.
func TestUnknownToolRefusedUnreserved(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, "")
			h := w.goSDK(w.proxyArgv(w.store))
			for i := range 2 {
				_, err := h.callErr(t.Context(), "no_such_tool", args, nil)
				var we *jsonrpc.Error
				require.ErrorAs(t, err, &we, "call %d", i)
				require.Equal(t, int64(jsonrpc.CodeInvalidParams), we.Code)
				require.Contains(t, we.Message, "no_such_tool")
			}
			require.NoError(t, h.close())
			require.Empty(t, w.residuals())
		})
	}
}

// TestBypassedAndReadOnlyToolsForwardedUntouched: a tool bypassed by policy and a tool
// annotated readOnlyHint are relayed as they are: each call reaches the upstream, answers
// are upstream's own, and the store holds nothing for them. A bypass of a tool annotated
// destructiveHint: true is ignored (annotations only make a tool stricter).
func TestBypassedAndReadOnlyToolsForwardedUntouched(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, `{"tools": {"note": {"mode": "bypass"}, "append": {"mode": "bypass"}}}`)
			direct := w.goSDK(w.directArgv())
			wantRead := direct.call(t, mcpfixture.ToolRead, map[string]any{}, nil)
			require.NoError(t, direct.close())

			h := w.goSDK(w.proxyArgv(w.store))
			require.Equal(t, wantRead.Raw, h.call(t, mcpfixture.ToolRead, map[string]any{}, nil).Raw)
			for range 2 {
				o := h.call(t, mcpfixture.ToolNote, args, nil)
				require.Equal(t, []string{"noted"}, o.Texts)
				require.False(t, o.Replayed)
			}
			require.Equal(t, []string{"2 lines"}, h.call(t, mcpfixture.ToolRead, map[string]any{}, nil).Texts)
			// append is annotated destructiveHint: the policy's bypass cannot loosen that.
			requireReplayOf(t, h.call(t, mcpfixture.ToolAppend, args, nil), h.call(t, mcpfixture.ToolAppend, args, nil))
			require.NoError(t, h.close())
			require.Equal(t, 3, w.effectCount(), "two notes (not guarded) and one append (guarded)")
			rs := w.residuals()
			require.Len(t, rs, 1, "bypassed and read-only calls leave no residual")
			require.Equal(t, "fx/append", rs[0].Operation)
		})
	}
}

// TestProgressReachesTheHost: the upstream's notifications/progress for a protected call
// reach the host with the host's own token.
func TestProgressReachesTheHost(t *testing.T) {
	t.Parallel()
	for _, fx := range fixtures {
		t.Run("upstream="+fx, func(t *testing.T) {
			t.Parallel()
			w := setup(t, fx, "")
			h := w.goSDK(w.proxyArgv(w.store))
			meta := mode(mcpfixture.ModeProgress)
			meta["progressToken"] = "tok-1"
			o := h.call(t, mcpfixture.ToolAppend, args, meta)
			require.False(t, o.IsError, o.Raw)
			for _, want := range []string{"half", "done"} {
				select {
				case p := <-h.progress:
					require.Equal(t, "tok-1", p.ProgressToken)
					require.Equal(t, want, p.Message)
				case <-time.After(30 * time.Second):
					t.Fatalf("no progress notification %q reached the host", want)
				}
			}
			require.Equal(t, 1, w.effectCount())
		})
	}
}

// TestTaskResultIsAwaitingUpstream: an mcp-go host asks for a task-augmented call; the
// mcp-go upstream answers with a task (MCP Tasks) and works on it (held at its gate after
// the effect): the proxy records it accepted and tells the host awaiting_upstream; the next
// call, while the task works, is refused awaiting_upstream and not sent.
func TestTaskResultIsAwaitingUpstream(t *testing.T) {
	t.Parallel()
	w := setup(t, "mcpgo", "")
	w.fifos()
	h := w.mcpGo(w.proxyArgv(w.store))
	o := h.callTask(t, mcpfixture.ToolAppend, args, mode(mcpfixture.ModeGate))
	require.True(t, o.IsError, o.Raw)
	require.Equal(t, kindAwaiting, o.Kind, o.Raw)
	w.awaitEntered()
	o = h.call(t, mcpfixture.ToolAppend, args, nil)
	require.Equal(t, kindAwaiting, o.Kind, o.Raw)
	w.release()
	require.NoError(t, h.close())
	require.Equal(t, 1, w.effectCount())
	require.Equal(t, 1, w.dispatchCount())
	rs := w.residuals()
	require.Len(t, rs, 1)
	require.Equal(t, residual.Accepted, rs[0].State)
	require.NotEmpty(t, rs[0].Handle)
}

// pgStore returns a postgres:// store in a schema of its own (dropped at the end).
func pgStore(t *testing.T) string {
	t.Helper()
	dsn := testkit.PostgresDSN(t)
	schema := testkit.Schema(t, "tf_interop_")
	l, err := postgres.Open(t.Context(), dsn, postgres.Options{Schema: schema})
	require.NoError(t, err, "the PostgreSQL cells need a server at TOOLFENCE_TEST_PG=%q", dsn)
	require.NoError(t, l.Close())
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestTwoProxiesOnOnePostgresStore: two hosts, each with its own proxy on one PostgreSQL
// store, make the same call: while the first is held upstream the second is refused
// in_progress; after it the second replays. One dispatch.
func TestTwoProxiesOnOnePostgresStore(t *testing.T) {
	t.Parallel()
	w := setup(t, "gosdk", "")
	w.fifos()
	store := pgStore(t)
	a, b := w.goSDK(w.proxyArgv(store)), w.goSDK(w.proxyArgv(store))
	first := make(chan outcome, 1)
	go func() {
		o, err := a.callErr(t.Context(), mcpfixture.ToolAppend, args, mode(mcpfixture.ModeGate))
		if err != nil {
			o = outcome{IsError: true, Texts: []string{err.Error()}}
		}
		first <- o
	}()
	w.awaitEntered()
	o := b.call(t, mcpfixture.ToolAppend, args, nil)
	require.Equal(t, kindInProgress, o.Kind, o.Raw)
	w.release()
	requireReplayOf(t, <-first, b.call(t, mcpfixture.ToolAppend, args, nil))
	require.Equal(t, 1, w.effectCount())
	require.Equal(t, 1, w.dispatchCount())
}

// TestBadInputIsAClearErrorAndWritesNothing: a malformed policy, a policy naming a tool the
// upstream does not list, a target pointer to an argument the call lacks, and an upstream
// that cannot start are errors that name the problem; nothing is written to the store and
// nothing reaches the upstream.
func TestBadInputIsAClearErrorAndWritesNothing(t *testing.T) {
	t.Parallel()
	t.Run("malformed policy", func(t *testing.T) {
		t.Parallel()
		w := setup(t, "gosdk", `{"tools": {"append": {"target": "/target"}}}`)
		r := w.run(w.proxyArgv(w.store)...)
		require.Equal(t, 2, r.code, r.stderr)
		require.Contains(t, r.stderr, "policy.json: mcpproxy: invalid policy")
		require.NoDirExists(t, w.store)
	})
	t.Run("unknown tool in the policy", func(t *testing.T) {
		t.Parallel()
		w := setup(t, "gosdk", `{"tools": {"send_mail": {"target": ["/to"]}}}`)
		h := w.goSDK(w.proxyArgv(w.store))
		o := h.call(t, mcpfixture.ToolAppend, args, nil)
		require.True(t, o.IsError)
		require.Equal(t, kindPolicy, o.Kind, o.Raw)
		require.Contains(t, o.text(), `the policy names tool "send_mail", which server "fx" does not list`)
		require.NoError(t, h.close())
		require.Zero(t, w.dispatchCount())
		require.Empty(t, w.residuals())
	})
	t.Run("target pointer to a missing argument", func(t *testing.T) {
		t.Parallel()
		w := setup(t, "gosdk", `{"tools": {"append": {"target": ["/to"]}}}`)
		h := w.goSDK(w.proxyArgv(w.store))
		o := h.call(t, mcpfixture.ToolAppend, args, nil)
		require.True(t, o.IsError)
		require.Equal(t, "invalid_input", o.Kind, o.Raw)
		require.Contains(t, o.text(), "/to")
		require.Contains(t, o.text(), "nothing was sent")
		require.NoError(t, h.close())
		require.Zero(t, w.dispatchCount())
		require.Empty(t, w.residuals())
	})
	t.Run("upstream that cannot start", func(t *testing.T) {
		t.Parallel()
		w := setup(t, "gosdk", "")
		missing := filepath.Join(w.dir, "no-such-server")
		r := w.run(bin, "proxy", "--store", w.store, "--server-id", "fx", "--", missing)
		require.Equal(t, 1, r.code, r.stderr)
		require.Contains(t, r.stderr, `starting upstream "`+missing+`"`)
		require.Empty(t, w.residuals())
	})
}

// TestUpstreamThatExitsAtOnceIsNamed: an upstream command that starts but exits at once
// (here `false`) while the host waits for its initialize answer: the proxy exits 1 with an
// error that says the upstream ended, and writes nothing. (It exited 1 with "read |0: file
// already closed", or 0 with nothing on stderr, before the proxy waited for the upstream's
// output and named its exit.)
func TestUpstreamThatExitsAtOnceIsNamed(t *testing.T) {
	t.Parallel()
	w := setup(t, "gosdk", "")
	r := w.run(bin, "proxy", "--store", w.store, "--server-id", "fx", "--", "false")
	require.Empty(t, w.residuals())
	require.Equal(t, 1, r.code, "stderr: %s", r.stderr)
	require.Contains(t, r.stderr, "upstream", "the error names the upstream")
}

// result is what one run of a command did.
type result struct {
	stderr string
	code   int
}

// run runs argv with the world's environment as a host would: an initialize request on
// stdin, which stays open (a host does not hang up first) until the process exits.
func (w *world) run(argv ...string) result {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = w.env()
	stdin, err := cmd.StdinPipe()
	require.NoError(w.t, err)
	defer stdin.Close()
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(w.t, cmd.Start())
	_, _ = io.WriteString(stdin, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw-host","version":"1"}}}`+"\n")
	err = cmd.Wait()
	require.NoError(w.t, ctx.Err(), "the proxy did not exit; stderr:\n%s", &stderr)
	var exit interface{ ExitCode() int }
	code := 0
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else {
		require.NoError(w.t, err)
	}
	return result{stderr: stderr.String(), code: code}
}
