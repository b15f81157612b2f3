package evals

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Cell is the tally of one scenario × subject.
type Cell struct {
	Scenario string          `json:"scenario"`
	Subject  string          `json:"subject"`
	Trials   int             `json:"trials"`
	Counts   map[Outcome]int `json:"counts"`
	// Reconciled is the number of residuals probes settled automatically.
	Reconciled int `json:"auto_reconciled"`
	// HarnessErrors counts trials where a worker misbehaved (timeout, exit code); they are
	// graded all the same.
	HarnessErrors int `json:"harness_errors"`
	// Omitted counts the trials of the cell report.json does not list (see Report.Results).
	Omitted int `json:"trials_omitted,omitempty"`
}

// Report is the result of a Run.
type Report struct {
	Seed     int64  `json:"seed"`
	Trials   int    `json:"trials_per_cell"`
	LeaseTTL string `json:"lease_ttl"`
	// HostRevision is the MCP revision of the proxy subjects' host.
	HostRevision string        `json:"host_revision"`
	Started      time.Time     `json:"started"`
	Duration     time.Duration `json:"duration_ns"`
	Scenarios    []Scenario    `json:"-"`
	Subjects     []string      `json:"subjects"`
	// Batch is how many trials of a cell shared each worker process.
	Batch int    `json:"batch"`
	Cells []Cell `json:"cells"`
	// Results lists the graded trials: every trial of a run of up to 20,000 trials; beyond
	// that, every toolfence trial that is not EXACTLY_ONCE, every trial with a harness error
	// or a note (other than the mode queued-202 chose), and the first 1,000 trials of each
	// baseline cell that are not EXACTLY_ONCE. Omitted counts the others (they are counted
	// in Cells).
	Results []TrialResult `json:"trials"`
	Omitted int           `json:"trials_omitted"`
}

// newReport returns the report of graded cells (in scenario × subject order) and the
// trials kept for listing.
func newReport(cfg Options, scens []Scenario, subs []string, cells []Cell, kept []TrialResult, omitted int, d time.Duration) *Report {
	return &Report{Seed: cfg.Seed, Trials: cfg.Trials, LeaseTTL: cfg.LeaseTTL.String(), HostRevision: cfg.HostRevision, Batch: cfg.Batch,
		Started: time.Now().Add(-d).UTC(), Duration: d, Scenarios: scens, Subjects: subs,
		Cells: cells, Results: kept, Omitted: omitted}
}

// hasProxy reports whether the run has a proxy subject.
func (r *Report) hasProxy() bool { return slices.ContainsFunc(r.Subjects, isProxySubject) }

func (r *Report) hasStress() bool {
	for _, sc := range r.Scenarios {
		if sc.Name == stressScenario {
			return true
		}
	}
	return false
}

// Failed reports whether any toolfence subject had a DUPLICATED, DIVERGED, LOST or
// FABRICATED trial.
func (r *Report) Failed() bool {
	for _, c := range r.Cells {
		if !isToolfence(c.Subject) {
			continue
		}
		for o, n := range c.Counts {
			if o.bad() && n > 0 {
				return true
			}
		}
	}
	return false
}

// cell returns the cell of scenario × subject, or the zero Cell when it was not run.
func (r *Report) cell(scenario, subject string) Cell {
	for _, c := range r.Cells {
		if c.Scenario == scenario && c.Subject == subject {
			return c
		}
	}
	return Cell{}
}

// cellText renders a cell's counts compactly: "5 ok", "3 DUP 2 ok", "4 blk 1 ok".
func cellText(c Cell) string {
	short := map[Outcome]string{ExactlyOnce: "ok", Blocked: "blocked", Duplicated: "DUP", Diverged: "DIV", Lost: "LOST", Fabricated: "FAB"}
	var parts []string
	for _, o := range []Outcome{Duplicated, Diverged, Lost, Fabricated, Blocked, ExactlyOnce} {
		if n := c.Counts[o]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, short[o]))
		}
	}
	if c.Reconciled > 0 {
		parts = append(parts, fmt.Sprintf("(%d rec)", c.Reconciled))
	}
	if c.HarnessErrors > 0 {
		parts = append(parts, fmt.Sprintf("[%d harness err]", c.HarnessErrors))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// Table renders the scenario × subject table as aligned text.
func (r *Report) Table() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "scenario\t%s\t\n", strings.Join(r.Subjects, "\t"))
	for _, sc := range r.Scenarios {
		row := []string{sc.Name}
		for _, sub := range r.Subjects {
			row = append(row, cellText(r.cell(sc.Name, sub)))
		}
		fmt.Fprintf(tw, "%s\t\n", strings.Join(row, "\t"))
	}
	_ = tw.Flush()
	fmt.Fprintf(&b, "\n%d trials per cell, seed %d, lease %s, %.1fs. ok = EXACTLY_ONCE, blocked = fail closed, rec = residuals settled by a probe automatically.\n",
		r.Trials, r.Seed, r.LeaseTTL, r.Duration.Seconds())
	if r.hasStress() {
		b.WriteString(stressScenario + " counts messages, not trials.\n")
	}
	if r.hasProxy() {
		b.WriteString("The proxy subjects' host speaks MCP " + r.HostRevision + ".\n")
	}
	return b.String()
}

// trialTotals returns the outcome counts of one subject's trials: every scenario but the
// stress test, whose cells count messages.
func (r *Report) trialTotals(subject string) map[Outcome]int {
	t := map[Outcome]int{}
	for _, c := range r.Cells {
		if c.Subject == subject && c.Scenario != stressScenario {
			for o, n := range c.Counts {
				t[o] += n
			}
		}
	}
	return t
}

// markdown renders the report as a Markdown document.
func (r *Report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# toolfence eval report\n\n%d trials per cell, seed %d, lease %s, run took %.1fs (%s).\n\n",
		r.Trials, r.Seed, r.LeaseTTL, r.Duration.Seconds(), r.Started.Format(time.RFC3339))
	if r.hasStress() {
		b.WriteString("The " + stressScenario + " row counts messages, not trials.\n\n")
	}
	if r.hasProxy() {
		b.WriteString("The proxy subjects' MCP host speaks MCP " + r.HostRevision + ".\n\n")
	}
	b.WriteString("Each trial runs one intended side effect (a charge) through a subject while the harness kills, " +
		"stops or fails the agent at a chosen point, lets a successor retry, and grades the trial from the upstream's " +
		"own log of the effects it performed. " +
		"Cells: EXACTLY_ONCE (ok), BLOCKED, DUPLICATED (DUP), DIVERGED (DIV), LOST, FABRICATED (FAB); " +
		"`rec` counts residuals settled automatically by a probe. Grades and subjects are defined below the tables.\n\n")
	fmt.Fprintf(&b, "| scenario | %s |\n|---|%s\n", strings.Join(r.Subjects, " | "), strings.Repeat("---|", len(r.Subjects)))
	for _, sc := range r.Scenarios {
		row := []string{sc.Name}
		for _, sub := range r.Subjects {
			row = append(row, cellText(r.cell(sc.Name, sub)))
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(row, " | "))
	}
	b.WriteString("\n## Totals per subject\n\n")
	if r.hasStress() {
		b.WriteString("Trials of every scenario but " + stressScenario + ", whose messages are counted in its row above only.\n\n")
	}
	b.WriteString("| subject |")
	for _, o := range outcomes {
		fmt.Fprintf(&b, " %s |", o)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(outcomes)) + "\n")
	for _, sub := range r.Subjects {
		t := r.trialTotals(sub)
		fmt.Fprintf(&b, "| %s |", sub)
		for _, o := range outcomes {
			fmt.Fprintf(&b, " %d |", t[o])
		}
		b.WriteString("\n")
	}
	b.WriteString("\n## Grades\n\nWorst first, as the grader applies them; DUPLICATED, DIVERGED, LOST and FABRICATED break " +
		"exactly-once, BLOCKED is safe but needs reconciling.\n\n")
	for _, o := range []Outcome{Diverged, Duplicated, Fabricated, Lost, ExactlyOnce, Blocked} {
		fmt.Fprintf(&b, "- **%s**: %s\n", o, o.doc())
	}
	b.WriteString("\n## Subjects\n\nThe toolfence subjects and the baselines, guards built the way idempotency is often done, " +
		"that toolfence is measured against.\n\n")
	for _, sub := range r.Subjects {
		fmt.Fprintf(&b, "- **%s**: %s\n", sub, subjectDoc(sub))
	}
	b.WriteString("\n## Scenarios\n\n")
	for _, sc := range r.Scenarios {
		fmt.Fprintf(&b, "- **%s**: %s\n", sc.Name, sc.Doc)
	}
	var bad []TrialResult
	for _, t := range r.Results {
		if t.Grade.Outcome.bad() && isToolfence(t.Subject) {
			bad = append(bad, t)
		}
	}
	if len(bad) > 0 {
		b.WriteString("\n## Failing toolfence trials\n\n")
		for _, t := range bad {
			fmt.Fprintf(&b, "- %s × %s #%d: %s %s\n", t.Scenario, t.Subject, t.Index, t.Grade.Outcome, t.Grade.Detail)
		}
	}
	return b.String()
}

var outcomeColors = map[Outcome]string{
	ExactlyOnce: "#2e7d32", Blocked: "#f9a825", Duplicated: "#c62828", Diverged: "#6a1b9a",
	Lost: "#1565c0", Fabricated: "#000000",
}

// svg renders grouped bars: for each subject, one bar per outcome with its share of trials.
func (r *Report) svg() string {
	const (
		barW, gap, groupGap, chartH, top, left = 14, 2, 28, 220, 40, 50
	)
	groupW := len(outcomes)*(barW+gap) + groupGap
	width := left + len(r.Subjects)*groupW + 20
	height := top + chartH + 90
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">Outcomes per subject (%% of trials; %d per cell, seed %d)</text>`+"\n", left, r.Trials, r.Seed)
	if r.hasStress() {
		fmt.Fprintf(&b, `<text x="%d" y="34" font-size="10">Trials only: the messages of %s are counted in report.md, not in these bars.</text>`+"\n",
			left, stressScenario)
	}
	for _, pct := range []int{0, 25, 50, 75, 100} {
		y := top + chartH - pct*chartH/100
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ddd"/><text x="%d" y="%d" text-anchor="end">%d%%</text>`+"\n",
			left, y, width-10, y, left-5, y+4, pct)
	}
	for gi, sub := range r.Subjects {
		t := r.trialTotals(sub)
		total := 0
		for _, n := range t {
			total += n
		}
		x0 := left + gi*groupW + groupGap/2
		for oi, o := range outcomes {
			h := 0
			if total > 0 {
				h = t[o] * chartH / total
			}
			x := x0 + oi*(barW+gap)
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"><title>%s %s: %d of %d</title></rect>`+"\n",
				x, top+chartH-h, barW, h, outcomeColors[o], html.EscapeString(sub), o, t[o], total)
			if t[o] > 0 {
				fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle" font-size="9">%d</text>`+"\n", x+barW/2, top+chartH-h-3, t[o])
			}
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n",
			x0+len(outcomes)*(barW+gap)/2, top+chartH+16, html.EscapeString(sub))
	}
	for oi, o := range outcomes {
		x := left + (oi%3)*180
		y := top + chartH + 40 + (oi/3)*18
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", x, y, outcomeColors[o], x+16, y+10, o)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// write writes report.json, report.md and report.svg into dir (created when missing).
func (r *Report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := r.writeJSON(filepath.Join(dir, "report.json")); err != nil {
		return fmt.Errorf("evals: writing report.json: %w", err)
	}
	for name, body := range map[string][]byte{
		"report.md": []byte(r.markdown()), "report.svg": []byte(r.svg()),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			return fmt.Errorf("evals: writing %s: %w", name, err)
		}
	}
	return nil
}

// writeJSON writes report.json to path: the header and the cells indented, then the
// trials one compact line each, streamed (a large run's list is never built in memory).
func (r *Report) writeJSON(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if err := r.encodeJSON(w); err != nil {
		f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// encodeJSON writes the report as JSON to w (see writeJSON).
func (r *Report) encodeJSON(w io.Writer) error {
	head := *r
	head.Results = nil
	js, err := json.MarshalIndent(struct {
		*Report
		Scenarios []scenarioDoc `json:"scenarios"`
	}{&head, scenarioDocs(r.Scenarios)}, "", "  ")
	if err != nil {
		return err
	}
	// Replace the empty "trials": null with one line per trial.
	const empty = `"trials": null`
	i := bytes.LastIndex(js, []byte(empty))
	if i < 0 {
		return fmt.Errorf("evals: report.json: no trials field")
	}
	bw := &errWriter{w: w}
	bw.write(js[:i])
	bw.write([]byte(`"trials": [`))
	for k, t := range r.Results {
		line, err := json.Marshal(t)
		if err != nil {
			return err
		}
		if k > 0 {
			bw.write([]byte(","))
		}
		bw.write([]byte("\n    "))
		bw.write(line)
	}
	if len(r.Results) > 0 {
		bw.write([]byte("\n  "))
	}
	bw.write([]byte("]"))
	bw.write(js[i+len(empty):])
	bw.write([]byte("\n"))
	return bw.err
}

// errWriter keeps the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) write(b []byte) {
	if e.err == nil {
		_, e.err = e.w.Write(b)
	}
}

type scenarioDoc struct {
	Name string `json:"name"`
	Doc  string `json:"doc"`
}

func scenarioDocs(s []Scenario) []scenarioDoc {
	out := make([]scenarioDoc, len(s))
	for i, sc := range s {
		out[i] = scenarioDoc{sc.Name, sc.Doc}
	}
	return out
}
