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
	rep, err := Run(t.Context(), Config{
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
