package mcpproxy_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/policy"
)

// repeatRig is a rig on a fake clock whose tool charge has the policy rule (JSON, "" for
// none) and the proxy's repeat window.
func repeatRig(t *testing.T, rule string, window time.Duration) (*rig, *lease.Fake) {
	t.Helper()
	clock := lease.NewFake(time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC))
	cfg := mcpproxy.Options{RepeatWindow: window}
	if rule != "" {
		pol, err := policy.Parse([]byte(`{"tools":{"charge":` + rule + `}}`))
		require.NoError(t, err)
		cfg.Policy = pol
	}
	return newRig(t, cfg, clock), clock
}

// charge has the host call charge {order: A} with id, expecting it sent upstream (answered
// there) or answered from the ledger with nothing sent; it returns the host's answer.
func (r *rig) charge(t *testing.T, id float64, first, sent bool) string {
	t.Helper()
	r.host.send(t, id, "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	if first {
		r.listed(t, chargeDef)
	}
	if !sent {
		answer := r.hostResult(t, id)
		require.Contains(t, answer, "[replayed] not sent")
		r.nothingSentUpstream(t, id+1000)
		return answer
	}
	call := r.up.nextReq(t)
	require.Equal(t, "tools/call", call.Method, "sent upstream")
	r.up.answer(t, call.ID, `{"content":[{"type":"text","text":"charged A"}]}`)
	answer := r.hostResult(t, id)
	require.NotContains(t, answer, "[replayed]")
	return answer
}

// The same call again after the repeat window has passed is new work (sent); before it,
// soon after the host had the answer and with nothing in between, it is answered from the
// ledger (the rig's host cannot be asked: no elicitation). The window is the proxy's, or the
// tool's repeat_window; "repeats: replay" never sends it, "repeats: send" always does once
// the host had the answer.
func TestProxyRepeatWindow(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		rule     string
		window   time.Duration
		soon     bool          // sent again right after
		after    time.Duration // clock advance before the third call
		sentLate bool
	}{
		{"default window", "", 0, false, mcpproxy.DefaultRepeatWindow, true},
		{"inside the window", "", 0, false, mcpproxy.DefaultRepeatWindow - time.Minute, false},
		{"proxy window", "", 2 * time.Minute, false, 2 * time.Minute, true},
		{"tool window", `{"repeat_window":"1m"}`, 0, false, time.Minute, true},
		{"no window", "", -1, true, 0, true},
		{"repeats send", `{"repeats":"send"}`, 0, true, 0, true},
		{"repeats replay", `{"repeats":"replay"}`, 0, false, 24 * time.Hour, false},
		{"target replays", `{"target":["/order"]}`, 0, false, 24 * time.Hour, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r, clock := repeatRig(t, c.rule, c.window)
			r.charge(t, 1, true, true)
			r.charge(t, 2, false, c.soon)
			clock.Advance(c.after)
			r.charge(t, 3, false, c.sentLate)
			require.Len(t, r.residuals(t)[0].Attempts, 1+b2i(c.soon)+b2i(c.sentLate), "one attempt per call sent, on one key")
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
