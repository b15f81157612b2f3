package evals

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
)

func TestEvalShort(t *testing.T) {
	testkit.SkipShort(t, "a crash eval of every scenario and subject (TestEvalProxy and the batched tests stay)")
	out := t.TempDir()
	if dir := os.Getenv("TOOLFENCE_EVAL_KEEP"); dir != "" {
		out = dir
	}
	// Every subject but the MCP proxy's, which TestEvalProxy runs.
	var subs []string
	for _, s := range allSubjects {
		if !isProxySubject(s) && (s != subjectToolfencePostgres || os.Getenv("TOOLFENCE_TEST_PG") != "") {
			subs = append(subs, s)
		}
	}
	rep, err := Run(t.Context(), Options{
		Trials: 2, Seed: 7, Out: out, Command: testCommand, WorkDir: t.TempDir(), StressMessages: 100, Parallel: 3,
		PostgresDSN: os.Getenv("TOOLFENCE_TEST_PG"), Subjects: subs,
	})
	require.NoError(t, err)
	t.Log("\n" + rep.Table())
	for _, r := range rep.Results {
		if r.Grade.Outcome.bad() && isToolfence(r.Subject) || r.Error != "" {
			t.Logf("%s × %s #%d: %s %s beliefs=%+v notes=%v err=%s", r.Scenario, r.Subject, r.Index, r.Grade.Outcome, r.Grade.Detail, r.Beliefs, r.Notes, r.Error)
		}
	}
	require.False(t, rep.Failed(), "a toolfence cell is not clean")
	for _, sub := range []string{subjectNone, subjectRecordAfter} {
		require.Positive(t, rep.cell("crash-b1", sub).Counts[Duplicated], "%s must show DUPLICATED at b1", sub)
	}
	require.Equal(t, 2, rep.cell("crash-b1", subjectMarkBefore).Counts[Fabricated],
		"a pending mark read as done is a success nobody performed")
	require.Equal(t, 2, rep.cell("crash-b1", subjectToolfenceNoProbe).Counts[Blocked],
		"without a probe an unknown outcome stays blocked: fail closed")
	require.Equal(t, 100, rep.cell(stressScenario, subjectToolfenceBadger).Trials, "stress cells count messages")
	require.Positive(t, rep.cell(stressScenario, subjectNone).Counts[Duplicated], "duplicate deliveries reach the sink unguarded")
	for _, f := range []string{"report.json", "report.md", "report.svg"} {
		_, err := os.Stat(filepath.Join(out, f))
		require.NoError(t, err)
	}
}

// TestEvalBatchedCrashB1 runs 8 trials of crash-b1 in one worker process per subject: one
// SIGKILL kills all of them after the sink performed every effect, and each trial is still
// graded on its own. The lease is 2 s rather than the default 500 ms: a reserve slower
// than lease minus margin (a loaded machine's fsync) fails closed as margin_too_small,
// which is correct but not what this test is about; a longer lease widens every such
// margin (the client timeout, lease/2, and the agents' budget, 8 leases) fourfold.
func TestEvalBatchedCrashB1(t *testing.T) {
	rep, err := Run(t.Context(), Options{
		Trials: 8, Batch: 8, Seed: 3, Command: testCommand, WorkDir: t.TempDir(), LeaseTTL: 2 * time.Second,
		Scenarios: []string{"crash-b1"}, Subjects: []string{subjectToolfenceBadger, subjectNone},
	})
	require.NoError(t, err)
	t.Log("\n" + rep.Table())
	require.Equal(t, 8, rep.Batch)
	require.Equal(t, 8, rep.cell("crash-b1", subjectToolfenceBadger).Counts[ExactlyOnce], "toolfence is clean in every trial")
	require.Equal(t, 8, rep.cell("crash-b1", subjectToolfenceBadger).Reconciled, "each trial's probe settled its own unknown outcome")
	require.Equal(t, 8, rep.cell("crash-b1", subjectNone).Counts[Duplicated], "every trial of the batch was killed at b1 and retried")
	require.Len(t, rep.Results, 16)
	intents := map[string]bool{}
	for _, r := range rep.Results {
		require.Empty(t, r.Notes, "every trial reached b1 before the kill: %s", r.Intent)
		require.Empty(t, r.Error)
		intents[r.Intent] = true
		if r.Subject == subjectNone {
			// w1's and w2's; more when the sink answered one of w2's requests after the
			// worker's client timeout (lease/2): the effect happened, the agent retried.
			// A loaded machine does that, so the count is a floor, not a fixed number.
			require.GreaterOrEqual(t, r.Grade.Effects, 2, r.Intent)
			continue
		}
		require.Equal(t, 1, r.Grade.Effects, "toolfence: w1's effect, settled by w2's probe: %s", r.Intent)
	}
	require.Len(t, intents, 16, "each trial has its own intent")
}

// TestEvalBatchedBarrierKill kills a batch of 6 at the reserved barrier: every trial's first
// worker dies there, and each successor finishes its own trial.
func TestEvalBatchedBarrierKill(t *testing.T) {
	rep, err := Run(t.Context(), Options{
		Trials: 6, Batch: 3, Seed: 5, Command: testCommand, WorkDir: t.TempDir(),
		Scenarios: []string{"crash-reserved", "queued-202"}, Subjects: []string{subjectToolfenceBadger, subjectRecordAfter},
	})
	require.NoError(t, err)
	t.Log("\n" + rep.Table())
	require.False(t, rep.Failed())
	require.Equal(t, 6, rep.cell("crash-reserved", subjectToolfenceBadger).Counts[ExactlyOnce])
	require.Equal(t, 6, rep.cell("crash-reserved", subjectRecordAfter).Counts[ExactlyOnce])
	for _, r := range rep.Results {
		if r.Scenario == "crash-reserved" {
			require.Empty(t, r.Notes, "every trial reached the barrier before the kill")
		}
	}
	// The queued-202 mode of a trial depends on the seed and the trial, not on the batch.
	again, err := Run(t.Context(), Options{
		Trials: 6, Batch: 2, Seed: 5, Command: testCommand, WorkDir: t.TempDir(),
		Scenarios: []string{"queued-202"}, Subjects: []string{subjectRecordAfter},
	})
	require.NoError(t, err)
	modes := func(rep *Report) []string {
		var out []string
		for _, r := range rep.Results {
			if r.Scenario == "queued-202" && r.Subject == subjectRecordAfter {
				out = append(out, r.Notes...)
			}
		}
		return out
	}
	require.Equal(t, modes(rep), modes(again))
	require.Len(t, modes(again), 6)
}

// TestEvalProxy runs the MCP proxy subjects: an MCP host (the worker) calls the payments MCP
// server (a real process) through the proxy (a real process on badger, killed or stopped
// with its host) or through a bare relay. The proxy is EXACTLY_ONCE in every trial (its
// probe settles what a kill left unknown); the relay duplicates the charge whenever a
// successor re-issues a call whose effect happened. It runs once with a 2026-07-28 host
// (stateless requests) and once with a 2025-11-25 host (a session); a host that does not
// get the revision it asked for is BLOCKED, so the counts below prove the revision ran.
func TestEvalProxy(t *testing.T) {
	for _, rev := range HostRevisions {
		t.Run(rev, func(t *testing.T) { testEvalProxy(t, rev) })
	}
}

func testEvalProxy(t *testing.T, rev string) {
	// A 2 s lease, as in TestEvalBatchedCrashB1: a call that loses a 500 ms lease to a slow
	// fsync under -race on a loaded machine fails closed (BLOCKED, correct), which is not what
	// this test is about.
	rep, err := Run(t.Context(), Options{
		Trials: 2, Seed: 11, Command: testCommand, WorkDir: t.TempDir(), Parallel: 3, LeaseTTL: 2 * time.Second,
		Scenarios: proxyScenarios, Subjects: []string{subjectToolfenceProxy, subjectPassThrough}, HostRevision: rev,
	})
	require.NoError(t, err)
	t.Log("\n" + rep.Table())
	require.Equal(t, rev, rep.HostRevision)
	for _, r := range rep.Results {
		t.Logf("%s × %s #%d: %s %s beliefs=%+v notes=%v err=%s", r.Scenario, r.Subject, r.Index, r.Grade.Outcome, r.Grade.Detail, r.Beliefs, r.Notes, r.Error)
	}
	require.False(t, rep.Failed(), "the proxy is EXACTLY_ONCE or BLOCKED in every trial")
	for _, sc := range proxyScenarios {
		c := rep.cell(sc, subjectToolfenceProxy)
		require.Equal(t, 2, c.Trials, sc)
		require.Equal(t, 2, c.Counts[ExactlyOnce]+c.Counts[Blocked], sc)
	}
	require.Equal(t, 2, rep.cell("crash-b0", subjectToolfenceProxy).Counts[ExactlyOnce], "killed before the call: the successor charges once")
	require.Equal(t, 2, rep.cell("crash-b2", subjectToolfenceProxy).Counts[ExactlyOnce], "killed after the answer: the successor's call is replayed")
	require.Equal(t, 2, rep.cell("crash-b1", subjectToolfenceProxy).Counts[ExactlyOnce],
		"killed after the charge, before the answer: the successor's proxy probes find_charge, settles it and replays")
	require.Equal(t, 2, rep.cell("zombie", subjectToolfenceProxy).Counts[ExactlyOnce], "the last successor settles the zombie's call by the probe")
	require.Equal(t, 2, rep.cell("crash-b0", subjectPassThrough).Counts[ExactlyOnce])
	for _, sc := range []string{"crash-b1", "crash-b2", "zombie"} {
		require.Equal(t, 2, rep.cell(sc, subjectPassThrough).Counts[Duplicated], "%s: a relay charges again", sc)
	}
	require.Zero(t, rep.cell("crash-reserved", subjectToolfenceProxy).Trials, "the proxy runs only its scenarios")
}
