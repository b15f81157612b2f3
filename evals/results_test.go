package evals

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fillCell stores n trials of scenario × subject, each with one effect its worker names,
// except those in dup (two effects) and herr (a harness error).
func fillCell(st *store, cfg Options, scenario, subject string, n int, dup, herr map[int]bool) {
	st.addCell(scenario, subject, n)
	for i := range n {
		intent := newBatch(&runner{cfg: cfg}, scenario, subject, i/cfg.Batch, []int{i}).trials[0].Intent
		id := i + 1
		e := func(k int) string { return "e-" + itoa(k) }
		st.addRecord(record{Kind: kindEffect, Intent: intent, ID: e(id), Digest: "ab"})
		if dup[i] {
			st.addRecord(record{Kind: kindEffect, Intent: intent, ID: e(id + 1_000_000), Digest: "ab"})
		}
		var harness string
		if herr[i] {
			harness = "worker exited 2"
		}
		st.put(scenario, subject, i, []Belief{{Worker: "w1", State: BeliefDone, Result: e(id)}}, nil, harness, time.Millisecond)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func jsonInt(n int) string { return strconv.Itoa(n) }

func TestReportKeepsEveryTrialOfASmallRun(t *testing.T) {
	t.Parallel()
	cfg := Options{Trials: 10, Batch: 4, Seed: 1, LeaseTTL: time.Second, WorkDir: t.TempDir()}
	st := newStore()
	fillCell(st, cfg, "crash-b1", subjectNone, 10, map[int]bool{3: true}, nil)
	rep := gradeAll(cfg, scenarios[2:3], []string{subjectNone}, st, time.Second)
	require.Len(t, rep.Results, 10)
	require.Zero(t, rep.Omitted)
	require.Equal(t, 9, rep.cell("crash-b1", subjectNone).Counts[ExactlyOnce])
	require.Equal(t, 1, rep.cell("crash-b1", subjectNone).Counts[Duplicated])
}

func TestReportOmitsCleanTrialsOfALargeRun(t *testing.T) {
	t.Parallel()
	const n = keepAllTrials/2 + 1 // two cells: one trial more than keepAllTrials
	cfg := Options{Trials: n, Batch: 500, Seed: 1, LeaseTTL: time.Second, WorkDir: t.TempDir()}
	st := newStore()
	dups := func(lo, hi int) map[int]bool {
		m := map[int]bool{}
		for i := lo; i < hi; i++ {
			m[i] = true
		}
		return m
	}
	// A baseline fails 1,200 trials: the report lists its first 1,000 failures.
	fillCell(st, cfg, "crash-b1", subjectNone, n, dups(100, 1300), map[int]bool{9000: true})
	// A toolfence failure is always listed, however many.
	fillCell(st, cfg, "crash-b1", subjectToolfenceBadger, n, dups(0, 1100), map[int]bool{7777: true})
	rep := gradeAll(cfg, scenarios[2:3], []string{subjectToolfenceBadger, subjectNone}, st, time.Second)

	none, tf := rep.cell("crash-b1", subjectNone), rep.cell("crash-b1", subjectToolfenceBadger)
	require.Equal(t, n, none.Trials, "the counts cover every trial")
	require.Equal(t, 1200, none.Counts[Duplicated])
	require.Equal(t, n-1200, none.Counts[ExactlyOnce])
	require.Equal(t, 1100, tf.Counts[Duplicated])
	require.Equal(t, 1, tf.HarnessErrors)
	require.Equal(t, 1000+1+1100+1, len(rep.Results), "1,000 baseline failures, every toolfence failure, both harness errors")
	require.Equal(t, n-1001, none.Omitted)
	require.Equal(t, n-1101, tf.Omitted)
	require.Equal(t, 2*n-len(rep.Results), rep.Omitted)
	listed := map[string]int{}
	for _, r := range rep.Results {
		require.True(t, r.Grade.Outcome != ExactlyOnce || r.Error != "")
		listed[r.Subject]++
		if r.Subject == subjectNone && r.Error == "" {
			require.Less(t, r.Index, 1100, "the first failures by index")
		}
	}
	require.Equal(t, 1001, listed[subjectNone])
	require.Equal(t, 1101, listed[subjectToolfenceBadger])

	dir := t.TempDir()
	require.NoError(t, rep.write(dir))
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	require.NoError(t, err)
	var js struct {
		Omitted int               `json:"trials_omitted"`
		Trials  []json.RawMessage `json:"trials"`
		Cells   []Cell            `json:"cells"`
	}
	require.NoError(t, json.Unmarshal(b, &js), "report.json stays valid JSON")
	require.Equal(t, rep.Omitted, js.Omitted)
	require.Len(t, js.Trials, len(rep.Results))
	require.Len(t, js.Cells, 2)
	for _, c := range js.Cells {
		require.Equal(t, rep.cell(c.Scenario, c.Subject).Omitted, c.Omitted, c.Subject)
	}
}

func TestStoreFilesRecordsUnderTheirTrial(t *testing.T) {
	t.Parallel()
	st := newStore()
	st.addCell("crash-b1", subjectNone, 3)
	st.addCell(stressScenario, subjectNone, 2)
	require.NotNil(t, st.trialOf("inv-crash-b1.none.b0.2"))
	require.Nil(t, st.trialOf("inv-crash-b1.none.b0.3"), "no such trial")
	require.Nil(t, st.trialOf("inv-crash-b2.none.b0.1"), "no such cell")
	require.NotNil(t, st.trialOf(stressIntent(stressScenario+"."+subjectNone, 1)))
	require.Nil(t, st.trialOf("stray"))

	digest := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	st.addRecord(record{Kind: kindAccepted, Intent: "inv-crash-b1.none.b0.1", Job: "j-4", Digest: digest})
	st.addRecord(record{Kind: kindEffect, Intent: "inv-crash-b1.none.b0.1", ID: "e-12", Job: "j-4", Digest: digest})
	st.addRecord(record{Kind: kindEffect, Intent: "inv-crash-b1.none.b0.1", ID: "odd-id", Digest: "not hex"})
	sl := st.trialOf("inv-crash-b1.none.b0.1")
	got := st.records("inv-crash-b1.none.b0.1", sl)
	require.Len(t, got, 3)
	require.Equal(t, record{Seq: 1, Kind: kindAccepted, Intent: "inv-crash-b1.none.b0.1", Job: "j-4", Digest: digest}, got[0])
	require.Equal(t, "e-12", got[1].ID)
	require.Equal(t, "j-4", got[1].Job)
	require.Equal(t, "odd-id", got[2].ID)
	require.NotEqual(t, got[0].Digest, got[2].Digest, "a digest that is not hex keeps its own identity")

	st.put("crash-b1", subjectNone, 1, []Belief{{Worker: "w2", State: BeliefDone, Result: "e-12", Reconciled: 2},
		{Worker: "w1", State: BeliefBlocked, Reason: "gave up"}}, nil, "", 0)
	require.Equal(t, []Belief{{Worker: "w2", State: BeliefDone, Result: "e-12", Reconciled: 2},
		{Worker: "w1", State: BeliefBlocked, Reason: "gave up"}}, st.beliefs("inv-crash-b1.none.b0.1", sl, false))
}
