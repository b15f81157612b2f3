package evals

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// reportWithStress is a report of every subject on crash-b1 (20 trials each) and on the
// stress test (700 messages each).
func reportWithStress() *Report {
	r := &Report{Trials: 20, Seed: 1, LeaseTTL: "500ms", Subjects: allSubjects}
	for _, sc := range scenarios {
		if sc.Name == "crash-b1" || sc.Name == stressScenario {
			r.Scenarios = append(r.Scenarios, sc)
		}
	}
	for _, sub := range allSubjects {
		r.Cells = append(r.Cells,
			Cell{Scenario: "crash-b1", Subject: sub, Trials: 20, Counts: map[Outcome]int{ExactlyOnce: 15, Blocked: 5}},
			Cell{Scenario: stressScenario, Subject: sub, Trials: 700, Counts: map[Outcome]int{ExactlyOnce: 690, Duplicated: 10}})
	}
	return r
}

// TestReportDefinesEverySubjectAndGrade checks that report.md says in a sentence what each
// subject (the baselines among them) and each grade is, so a reader needs no other document.
func TestReportDefinesEverySubjectAndGrade(t *testing.T) {
	t.Parallel()
	md := reportWithStress().markdown()
	for _, sub := range allSubjects {
		doc := subjectDoc(sub)
		require.NotEmpty(t, doc, sub)
		require.Contains(t, md, fmt.Sprintf("- **%s**: %s\n", sub, doc))
	}
	for _, o := range outcomes {
		require.NotEmpty(t, o.doc(), o)
		require.Contains(t, md, fmt.Sprintf("- **%s**: %s\n", o, o.doc()))
	}
	require.NotRegexp(t, `(?i)seed[ -]?\d{3}|DESIGN\.md|STYLE\.md`, md, "no reference to documents a reader does not have")
}

// TestChartBarsCountTrialsOnly checks that the chart's bars count the trials of each cell,
// not the stress test's messages: 20 trials per cell here, 700 messages beside them.
func TestChartBarsCountTrialsOnly(t *testing.T) {
	t.Parallel()
	r := reportWithStress()
	svg := r.svg()
	titles := regexp.MustCompile(`<title>(\S+) (\S+): (\d+) of (\d+)</title>`).FindAllStringSubmatch(svg, -1)
	require.Len(t, titles, len(allSubjects)*len(outcomes))
	for _, m := range titles {
		require.Equal(t, "20", m[4], "a bar of %s counts the %d trials of its one trial cell: %s", m[1], r.Trials, m[0])
	}
	require.Contains(t, svg, "20 per cell")
	require.Contains(t, svg, "the messages of "+stressScenario+" are counted in report.md, not in these bars")
	md := r.markdown()
	require.Contains(t, md, "| none | 15 | 5 | 0 | 0 | 0 | 0 |", "the totals count trials")
	require.True(t, strings.Contains(md, "690 ok"), "the stress row keeps its message counts")
}
