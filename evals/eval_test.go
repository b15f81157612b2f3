package evals

import (
	"os"
	"path/filepath"
	"testing"

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
		if r.Grade.Outcome.Bad() && IsToolfence(r.Subject) || r.Error != "" {
			t.Logf("%s × %s #%d: %s %s beliefs=%+v notes=%v err=%s", r.Scenario, r.Subject, r.Index, r.Grade.Outcome, r.Grade.Detail, r.Beliefs, r.Notes, r.Error)
		}
	}
	require.False(t, rep.Failed(), "a toolfence cell is not clean")
	for _, sub := range []string{SubjectNone, SubjectRecordAfter} {
		require.Positive(t, rep.Cell("crash-b1", sub).Counts[Duplicated], "%s must show DUPLICATED at b1", sub)
	}
	require.Equal(t, 2, rep.Cell("crash-b1", SubjectMarkBefore).Counts[Fabricated],
		"a pending mark read as done is a success nobody performed")
	require.Equal(t, 2, rep.Cell("crash-b1", SubjectToolfenceNoProbe).Counts[Blocked],
		"without a probe an unknown outcome stays blocked: fail closed")
	require.Equal(t, 100, rep.Cell(StressScenario, SubjectToolfenceBadger).Trials, "stress cells count messages")
	require.Positive(t, rep.Cell(StressScenario, SubjectNone).Counts[Duplicated], "duplicate deliveries reach the sink unguarded")
	for _, f := range []string{"report.json", "report.md", "report.svg"} {
		_, err := os.Stat(filepath.Join(out, f))
		require.NoError(t, err)
	}
}

// TestEvalBatchedCrashB1 runs 8 trials of crash-b1 in one worker process per subject: one
// SIGKILL kills all of them after the sink performed every effect, and each trial is still
// graded on its own.
func TestEvalBatchedCrashB1(t *testing.T) {
	rep, err := Run(t.Context(), Options{
		Trials: 8, Batch: 8, Seed: 3, Command: testCommand, WorkDir: t.TempDir(),
		Scenarios: []string{"crash-b1"}, Subjects: []string{SubjectToolfenceBadger, SubjectNone},
	})
	require.NoError(t, err)
	t.Log("\n" + rep.Table())
	require.Equal(t, 8, rep.Batch)
	require.Equal(t, 8, rep.Cell("crash-b1", SubjectToolfenceBadger).Counts[ExactlyOnce], "toolfence is clean in every trial")
	require.Equal(t, 8, rep.Cell("crash-b1", SubjectToolfenceBadger).Reconciled, "each trial's probe settled its own unknown outcome")
	require.Equal(t, 8, rep.Cell("crash-b1", SubjectNone).Counts[Duplicated], "every trial of the batch was killed at b1 and retried")
	require.Len(t, rep.Results, 16)
	intents := map[string]bool{}
	for _, r := range rep.Results {
		require.Empty(t, r.Notes, "every trial reached b1 before the kill: %s", r.Intent)
		require.Empty(t, r.Error)
		want := 1 // toolfence: w1's effect, settled by w2's probe
		if r.Subject == SubjectNone {
			want = 2 // w1's and w2's
		}
		require.Equal(t, want, r.Grade.Effects, r.Intent)
		intents[r.Intent] = true
	}
	require.Len(t, intents, 16, "each trial has its own intent")
}

// TestEvalBatchedBarrierKill kills a batch of 6 at the reserved barrier: every trial's first
// worker dies there, and each successor finishes its own trial.
func TestEvalBatchedBarrierKill(t *testing.T) {
	rep, err := Run(t.Context(), Options{
		Trials: 6, Batch: 3, Seed: 5, Command: testCommand, WorkDir: t.TempDir(),
		Scenarios: []string{"crash-reserved", "queued-202"}, Subjects: []string{SubjectToolfenceBadger, SubjectRecordAfter},
	})
	require.NoError(t, err)
	t.Log("\n" + rep.Table())
	require.False(t, rep.Failed())
	require.Equal(t, 6, rep.Cell("crash-reserved", SubjectToolfenceBadger).Counts[ExactlyOnce])
	require.Equal(t, 6, rep.Cell("crash-reserved", SubjectRecordAfter).Counts[ExactlyOnce])
	for _, r := range rep.Results {
		if r.Scenario == "crash-reserved" {
			require.Empty(t, r.Notes, "every trial reached the barrier before the kill")
		}
	}
	// The queued-202 mode of a trial depends on the seed and the trial, not on the batch.
	again, err := Run(t.Context(), Options{
		Trials: 6, Batch: 2, Seed: 5, Command: testCommand, WorkDir: t.TempDir(),
		Scenarios: []string{"queued-202"}, Subjects: []string{SubjectRecordAfter},
	})
	require.NoError(t, err)
	modes := func(rep *Report) []string {
		var out []string
		for _, r := range rep.Results {
			if r.Scenario == "queued-202" && r.Subject == SubjectRecordAfter {
				out = append(out, r.Notes...)
			}
		}
		return out
	}
	require.Equal(t, modes(rep), modes(again))
	require.Len(t, modes(again), 6)
}
