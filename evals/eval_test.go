package evals

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEvalShort(t *testing.T) {
	out := t.TempDir()
	if dir := os.Getenv("TOOLFENCE_EVAL_KEEP"); dir != "" {
		out = dir
	}
	rep, err := Run(t.Context(), Options{
		Trials: 2, Seed: 7, Out: out, Command: testCommand, WorkDir: t.TempDir(), StressMessages: 100, Parallel: 3,
		PostgresDSN: os.Getenv("TOOLFENCE_TEST_PG"),
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
