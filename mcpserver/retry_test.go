package mcpserver_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// TestCommitCallIdenticalRetry: a client whose commit_call landed but whose answer was lost
// sends the identical commit_call again and is answered with the recorded outcome, with
// nothing written (no "late commit refused" evidence). A different outcome under the same
// token is still refused as lease_lost.
func TestCommitCallIdenticalRetry(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	a := e.dial(tokA, legacy)
	b := beginOn(t, a, "invoice:retry")
	require.Equal(t, mcpserver.DecisionProceed, b.Decision)
	args := commitArgs(b, "succeeded", m{"result": m{"charge": "ch_1"}, "upstream_status": 200})
	first := ok[mcpserver.CommitResult](t, a, "commit_call", args)
	require.Equal(t, residual.Succeeded, first.State)
	recorded := snapshot(t, e.led, nsA)

	again := ok[mcpserver.CommitResult](t, a, "commit_call", args)
	require.Equal(t, residual.Succeeded, again.State)
	require.Equal(t, first.Token, again.Token)
	require.Equal(t, first.ResultDigest, again.ResultDigest)
	require.Equal(t, recorded, snapshot(t, e.led, nsA), "an identical retry writes nothing")

	info := fails(t, a, "commit_call", commitArgs(b, "unknown", nil))
	require.Equal(t, mcpwire.KindLeaseLost, info.Kind, info.Message)
	info = fails(t, a, "commit_call", commitArgs(b, "succeeded", m{"result": m{"charge": "ch_2"}, "upstream_status": 200}))
	require.Equal(t, mcpwire.KindLeaseLost, info.Kind, "another result under the old token: %s", info.Message)
}
