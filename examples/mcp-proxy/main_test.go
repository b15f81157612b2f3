package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/examples/payments"
)

// TestExampleExactlyOneCharge builds toolfence, the payments server and the example, and
// runs the story with real processes: run 1 (an MCP host and the proxy it started) is
// SIGKILLed after the payments server made the charge durable and before it answered; run 2
// re-issues the call through a new proxy on the same store. The payments ledger holds
// exactly one charge, and run 2 was not charged again: its proxy met run 1's unknown outcome,
// asked the payments server through the policy's probe (find_charge), recorded the charge as
// done and replayed it to the agent.
func TestExampleExactlyOneCharge(t *testing.T) {
	bin, dir := t.TempDir(), t.TempDir()
	build := exec.Command("go", "build", "-o", bin+string(filepath.Separator),
		"github.com/toolfence/toolfence/cmd/toolfence", "github.com/toolfence/toolfence/examples/mcp-proxy",
		"github.com/toolfence/toolfence/examples/mcp-proxy/payments")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, filepath.Join(bin, "mcp-proxy"), "-toolfence", filepath.Join(bin, "toolfence"),
		"-payments", filepath.Join(bin, "payments"), "-dir", dir)
	out, err = run.CombinedOutput()
	t.Logf("the example printed:\n%s", out)
	require.NoError(t, err, "the example must exit 0")

	cs, err := payments.ReadLedger(filepath.Join(dir, "ledger.jsonl"))
	require.NoError(t, err)
	require.Len(t, cs, 1, "exactly one charge")
	require.Equal(t, "ORD-1042", cs[0].OrderID)

	require.Contains(t, string(out), "run 1 ended: signal: killed")
	require.Regexp(t, `run 2 \|   tool answered: \[replayed\] not sent: toolfence answered this call from its ledger\.[^\n]+\nrun 2 \| \{"charge_id":"ch_1","found":true\}`, string(out),
		"run 2's call was settled by the probe and replayed, not charged again")
	require.NotContains(t, string(out), "run 2 |   tool answered: blocked: a previous attempt may have reached")
	require.NotContains(t, string(out), "toolfence: call refused", "the unknown outcome the probe settled is not logged as a refused call")
	require.Contains(t, string(out), "OK: exactly one charge")
}
