package interop_test

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/fixture/mcpfixture"
	"github.com/toolfence/toolfence/residual"
)

// The host's user settles an unknown outcome where they are: a TypeScript SDK host
// (2025-11-25, elicitation/create) answers the proxy's question in its form. "No" records
// the earlier attempt failed and sends the call; "Yes" records it succeeded and answers from
// the ledger; "I don't know" keeps it unknown. The resolution names the host's user, and its
// evidence is the user's answer to the question.
func TestHostUserSettlesAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	nodeBin := node(t)
	for _, c := range []struct {
		answer      string
		effects     int
		second      func(t *testing.T, o outcome)
		state       residual.State
		resolvedAs  residual.State
		resolutions int
	}{
		{"No, it had no effect", 2, func(t *testing.T, o outcome) {
			require.False(t, o.IsError, o.Raw)
			require.False(t, o.Replayed, "sent again: %s", o.Raw)
		}, residual.Succeeded, residual.Failed, 1},
		{"Yes, it took effect", 1, func(t *testing.T, o outcome) {
			require.False(t, o.IsError, o.Raw)
			require.True(t, o.Replayed, "answered from the ledger: %s", o.Raw)
		}, residual.Succeeded, residual.Succeeded, 1},
		{"I don't know", 1, func(t *testing.T, o outcome) {
			require.True(t, o.IsError, o.Raw)
			require.Equal(t, kindUnknown, o.Kind)
			require.Contains(t, o.text(), "the host's user answered \"I don't know\"")
		}, residual.Unknown, "", 0},
	} {
		t.Run(c.answer, func(t *testing.T) {
			t.Parallel()
			w := setup(t, "gosdk", "")
			spec := w.tsStdio(w.proxyArgv(w.store))
			spec["elicit"] = []string{c.answer}
			spec["calls"] = []tsCall{
				{Name: mcpfixture.ToolAppend, Arguments: args, Meta: mode(mcpfixture.ModeIsError)},
				{Name: mcpfixture.ToolAppend, Arguments: args},
			}
			_, outs, asked := w.tsJobAsked(nodeBin, spec)
			require.Equal(t, kindUnknown, outs[0].Kind, "the isError answer may have acted: %s", outs[0].Raw)
			require.Len(t, asked, 1, "the user was asked once")
			require.Contains(t, asked[0], "may or may not have taken effect")
			require.Contains(t, asked[0], "boom after the write", "the question quotes what upstream answered")
			c.second(t, outs[1])
			require.Equal(t, c.effects, w.effectCount())
			rs := w.residuals()
			require.Len(t, rs, 1)
			require.Equal(t, c.state, rs[0].State)
			require.Len(t, rs[0].Resolutions, c.resolutions)
			if c.resolutions > 0 {
				res := rs[0].Resolutions[0]
				require.Equal(t, c.resolvedAs, res.To)
				require.Equal(t, "host-user:ts-sdk-host", res.By, "attributed to the host's user, not the model")
				require.Contains(t, res.Evidence, `answered "`+c.answer+`"`)
			}
		})
	}
}

// An identical call soon after the host had the answer (nothing in between) cannot be told
// from a retry by the call alone: a Go SDK host (2026-07-28: the proxy's own input_required
// round, answered by the SDK's elicitation handler) is asked; "Run it again" sends it, "Don't
// run it" answers from the ledger. A TypeScript SDK host (2025-11-25) is asked with
// elicitation/create.
func TestHostUserDecidesARepeat(t *testing.T) {
	t.Parallel()
	t.Run("go-sdk", func(t *testing.T) {
		t.Parallel()
		for _, answer := range []string{"Run it again", "Don't run it"} {
			w := setup(t, "gosdk", "")
			var asked []string
			h := w.goSDKElicit(w.proxyArgv(w.store), func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				asked = append(asked, r.Params.Message)
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"answer": answer}}, nil
			})
			first := h.call(t, mcpfixture.ToolAppend, args, nil)
			second := h.call(t, mcpfixture.ToolAppend, args, nil)
			require.False(t, first.IsError, first.Raw)
			require.False(t, second.IsError, second.Raw)
			require.Len(t, asked, 1)
			require.Contains(t, asked[0], "Run it again?")
			if answer == "Run it again" {
				require.False(t, second.Replayed, second.Raw)
				require.Equal(t, 2, w.effectCount())
				require.NoError(t, h.close())
				rs := w.residuals()
				require.Len(t, rs[0].Attempts, 2, "a new attempt on the same key")
				continue
			}
			require.True(t, second.Replayed, second.Raw)
			require.Contains(t, second.text(), "the host's user chose not to run it again")
			require.Equal(t, 1, w.effectCount())
		}
	})
	t.Run("ts-sdk", func(t *testing.T) {
		t.Parallel()
		w := setup(t, "gosdk", "")
		nodeBin := node(t)
		spec := w.tsStdio(w.proxyArgv(w.store))
		spec["elicit"] = []string{"Run it again"}
		spec["calls"] = []tsCall{{Name: mcpfixture.ToolAppend, Arguments: args}, {Name: mcpfixture.ToolAppend, Arguments: args}}
		_, outs, asked := w.tsJobAsked(nodeBin, spec)
		require.Len(t, asked, 1)
		require.False(t, outs[1].Replayed, outs[1].Raw)
		require.Equal(t, 2, w.effectCount())
	})
}

// Without elicitation the repeat is answered from the ledger and says plainly that nothing
// was sent, when the identical call was recorded and how to make it new work; A, B, A sends
// the second A (another call of the tool came after the host had A's answer).
func TestRepeatWithoutElicitation(t *testing.T) {
	t.Parallel()
	w := setup(t, "gosdk", "")
	h := w.goSDK(w.proxyArgv(w.store))
	a := h.call(t, mcpfixture.ToolAppend, args, nil)
	again := h.call(t, mcpfixture.ToolAppend, args, nil)
	require.True(t, again.Replayed, again.Raw)
	note := again.Texts[0]
	require.Contains(t, note, "not sent")
	require.Contains(t, note, "recorded at ")
	require.Contains(t, note, "toolfence.dev/task")
	require.Equal(t, a.Texts, again.Texts[1:])
	b := h.call(t, mcpfixture.ToolAppend, args2, nil)
	require.False(t, b.Replayed)
	third := h.call(t, mcpfixture.ToolAppend, args, nil)
	require.False(t, third.Replayed, "A, B, A: the second A is sent: %s", third.Raw)
	require.Equal(t, 3, w.effectCount())
	require.NoError(t, h.close())
	var attempts []int
	for _, r := range w.residuals() {
		attempts = append(attempts, len(r.Attempts))
	}
	require.ElementsMatch(t, []int{2, 1}, attempts)
}

// A Go SDK host (2026-07-28 over stdio: the proxy asks in an input_required round of its
// own) settles an unknown outcome in its elicitation form: "No" records it failed and the
// call is sent; the resolution names the host's user.
func TestHostUserSettlesAnUnknownOutcomeGoSDK(t *testing.T) {
	t.Parallel()
	w := setup(t, "gosdk", "")
	var asked []string
	h := w.goSDKElicit(w.proxyArgv(w.store), func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		asked = append(asked, r.Params.Message)
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"answer": "No, it had no effect"}}, nil
	})
	first := h.call(t, mcpfixture.ToolAppend, args, mode(mcpfixture.ModeIsError))
	require.Equal(t, kindUnknown, first.Kind, first.Raw)
	second := h.call(t, mcpfixture.ToolAppend, args, nil)
	require.False(t, second.IsError, second.Raw)
	require.False(t, second.Replayed)
	require.Len(t, asked, 1)
	require.Contains(t, asked[0], "Did the earlier call take effect?")
	require.Contains(t, asked[0], "boom after the write")
	require.Equal(t, 2, w.effectCount())
	require.NoError(t, h.close())
	rs := w.residuals()
	require.Len(t, rs, 1)
	require.Len(t, rs[0].Resolutions, 1)
	require.Equal(t, "host-user:go-sdk-host", rs[0].Resolutions[0].By)
	require.Equal(t, residual.Failed, rs[0].Resolutions[0].To)
}
