package residual_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/residual"
)

// allStates is None plus the five states, so the transition table is checked exhaustively.
var allStates = []residual.State{
	residual.None, residual.Pending, residual.Unknown,
	residual.Accepted, residual.Succeeded, residual.Failed,
}

// allowed is the transition table of docs/design.md, written out independently of state.go.
var allowed = map[[2]residual.State]bool{
	{residual.None, residual.Pending}: true,

	{residual.Pending, residual.Succeeded}: true,
	{residual.Pending, residual.Accepted}:  true,
	{residual.Pending, residual.Failed}:    true,
	{residual.Pending, residual.Unknown}:   true,

	{residual.Unknown, residual.Succeeded}: true,
	{residual.Unknown, residual.Failed}:    true,
	// Re-dispatch of an upstream-idempotent operation under the same upstream key.
	{residual.Unknown, residual.Pending}: true,

	{residual.Accepted, residual.Succeeded}: true,
	{residual.Accepted, residual.Failed}:    true,

	{residual.Failed, residual.Pending}: true,
	// A new intent over a settled success (ledger.ReserveParams.Supersede); nothing else
	// leaves succeeded.
	{residual.Succeeded, residual.Pending}: true,
}

func name(s residual.State) string {
	if s == residual.None {
		return "none"
	}
	return string(s)
}

func TestTransitionTable(t *testing.T) {
	t.Parallel()
	nAllowed := 0
	for _, from := range allStates {
		for _, to := range allStates {
			t.Run(name(from)+"->"+name(to), func(t *testing.T) {
				t.Parallel()
				err := residual.Transition(from, to)
				if allowed[[2]residual.State{from, to}] {
					require.NoError(t, err)
					return
				}
				require.Error(t, err)
				require.ErrorIs(t, err, residual.ErrInvalidTransition)
				require.Contains(t, err.Error(), name(from), "error must name the source state")
				require.Contains(t, err.Error(), name(to), "error must name the target state")
				// The two names must appear in order: from before to.
				i := strings.Index(err.Error(), name(from))
				require.GreaterOrEqual(t, i, 0)
				require.Contains(t, err.Error()[i+len(name(from)):], name(to))
			})
			if allowed[[2]residual.State{from, to}] {
				nAllowed++
			}
		}
	}
	require.Equal(t, 12, nAllowed, "the table of docs/design.md has twelve allowed moves")
}

func TestTransitionSameStateRefused(t *testing.T) {
	t.Parallel()
	for _, s := range allStates {
		require.ErrorIs(t, residual.Transition(s, s), residual.ErrInvalidTransition, "stay in %s", name(s))
	}
}

// Succeeded is never settled again (resolved, committed, re-opened as unknown or accepted):
// it only leaves for a new pending attempt.
func TestTransitionSucceededLeavesOnlyForANewAttempt(t *testing.T) {
	t.Parallel()
	for _, to := range allStates {
		if to == residual.Pending {
			require.NoError(t, residual.Transition(residual.Succeeded, to))
			continue
		}
		require.ErrorIs(t, residual.Transition(residual.Succeeded, to), residual.ErrInvalidTransition, "succeeded -> %s", name(to))
	}
}

func TestTransitionUnknownStatesRefused(t *testing.T) {
	t.Parallel()
	bogus := residual.State("bogus")
	for _, s := range allStates {
		require.ErrorIs(t, residual.Transition(bogus, s), residual.ErrInvalidTransition)
		require.ErrorIs(t, residual.Transition(s, bogus), residual.ErrInvalidTransition)
	}
	// Case matters: "Pending" is not a state.
	require.ErrorIs(t, residual.Transition(residual.None, residual.State("Pending")), residual.ErrInvalidTransition)
}

func TestTransitionErrorIsNotOtherSentinels(t *testing.T) {
	t.Parallel()
	err := residual.Transition(residual.Succeeded, residual.Pending)
	for _, other := range []error{
		residual.ErrNotFound, residual.ErrInProgress, residual.ErrUnknownOutcome,
		residual.ErrAwaitingUpstream, residual.ErrPayloadMismatch, residual.ErrLeaseLost,
		residual.ErrMarginTooSmall, residual.ErrInvalidState, residual.ErrInvalidKey,
	} {
		require.False(t, errors.Is(err, other), "transition error must not match %v", other)
	}
}

func TestParseState(t *testing.T) {
	t.Parallel()
	for _, s := range []residual.State{residual.Pending, residual.Unknown, residual.Accepted, residual.Succeeded, residual.Failed} {
		got, err := residual.ParseState(string(s))
		require.NoError(t, err)
		require.Equal(t, s, got)
		// Round trip through String.
		got, err = residual.ParseState(s.String())
		require.NoError(t, err)
		require.Equal(t, s, got)
	}
	for _, bad := range []string{"", "none", "Pending", "PENDING", " pending", "pending ", "done", "success", "unknown\x00"} {
		got, err := residual.ParseState(bad)
		require.ErrorIs(t, err, residual.ErrInvalidState, "%q", bad)
		require.Equal(t, residual.None, got, "%q", bad)
		require.Contains(t, err.Error(), fmt.Sprintf("%q", bad), "error must quote the input")
	}
}

func TestStatePredicates(t *testing.T) {
	t.Parallel()
	tests := []struct {
		s                     residual.State
		valid, terminal, open bool
	}{
		{residual.None, false, false, false},
		{residual.Pending, true, false, true},
		{residual.Unknown, true, false, true},
		{residual.Accepted, true, false, true},
		{residual.Succeeded, true, true, false},
		{residual.Failed, true, true, false},
		{residual.State("bogus"), false, false, false},
		{residual.State("Succeeded"), false, false, false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.valid, tt.s.Valid(), "%q.Valid", string(tt.s))
		require.Equal(t, tt.terminal, tt.s.Terminal(), "%q.Terminal", string(tt.s))
		require.Equal(t, tt.open, tt.s.Open(), "%q.Open", string(tt.s))
	}
	// Every valid state is exactly one of terminal or open.
	for _, s := range residual.States {
		require.True(t, s.Valid())
		require.NotEqual(t, s.Terminal(), s.Open(), "%s must be terminal xor open", s)
	}
}

func TestStatesListsTheFiveStates(t *testing.T) {
	t.Parallel()
	require.ElementsMatch(t, []residual.State{
		residual.Pending, residual.Unknown, residual.Accepted, residual.Succeeded, residual.Failed,
	}, residual.States)
}

func TestStateString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "none", residual.None.String())
	require.Equal(t, "pending", residual.Pending.String())
	require.Equal(t, "succeeded", residual.Succeeded.String())
}
