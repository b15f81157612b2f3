package evals

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/toolfence/toolfence/interceptor"
)

// Options configure Run. Command is required; every other field has a default.
type Options struct {
	// Trials per scenario × subject cell. Defaults to 4.
	Trials int
	// Seed makes the trial order and the random choices of scenarios reproducible (the
	// process schedule itself is not). Defaults to 1.
	Seed int64
	// Out is the directory for report.json, report.md and report.svg; empty writes none.
	Out string
	// Scenarios and Subjects select cells by name; empty selects all (toolfence-postgres
	// only when PostgresDSN is set).
	Scenarios []string
	Subjects  []string
	// PostgresDSN enables the toolfence-postgres subject; each run uses its own schema.
	PostgresDSN string
	// Command starts this binary in a role ("worker" or "sink"). Required.
	Command CommandFunc
	// Progress receives a progress bar (stderr); nil shows none.
	Progress io.Writer
	// Parallel is how many batches run at once. Defaults to 2.
	Parallel int
	// Batch is how many trials of one cell share each worker process (they run at once in
	// it, die together at the barrier, and share the batch's store directory; each keeps
	// its own intent, task, agents and grade). Defaults to min(Trials, 500).
	Batch int
	// LeaseTTL is the toolfence lease and the baselines' pending TTL. Defaults to 500ms.
	LeaseTTL time.Duration
	// StressMessages is the message count of the stress-redelivery scenario. Defaults to 500.
	StressMessages int
	// WorkDir holds the stores and the sink log. Defaults to a new temporary directory,
	// removed at the end.
	WorkDir string
	// HostRevision is the MCP protocol revision the proxy subjects' host asks for
	// ("2026-07-28" or "2025-11-25"). Defaults to the newest the Go SDK speaks; a trial whose
	// session settles on another revision is BLOCKED, not run on the wrong one.
	HostRevision string
}

// HostRevisions are the MCP revisions the proxy subjects' host can ask for, newest (the
// default) first.
var HostRevisions = []string{"2026-07-28", "2025-11-25"}

// allSubjects lists the subjects in report order.
var allSubjects = []string{
	subjectToolfenceBadger, subjectToolfencePostgres, subjectToolfenceNoProbe, subjectNone, subjectRecordAfter,
	subjectCheckThenInsert, subjectExpiring, subjectMarkBefore, subjectToolfenceProxy, subjectPassThrough,
}

type runner struct {
	cfg    Options
	sink   sinkClient
	schema string
	// proxyPolicy is the path of the proxy subject's policy file.
	proxyPolicy string
}

func (r *runner) workerTimeout() time.Duration { return 20*r.cfg.LeaseTTL + 10*time.Second }

// rngFor returns the random source of trial index of a cell: it depends on the seed and
// the trial, not on the batch the trial ran in.
func (r *runner) rngFor(scenario, subject string, index int) *rand.Rand {
	h := r.cfg.Seed
	for _, c := range scenario + "/" + subject {
		h = h*31 + int64(c)
	}
	return rand.New(rand.NewSource(h*1_000_003 + int64(index)))
}

// stress runs the redelivery stress test against one subject in one worker process and
// stores one trial per message.
func (r *runner) stress(subject string, st *store) {
	t0 := time.Now()
	dir := filepath.Join(r.cfg.WorkDir, "stores", stressScenario+"."+subject)
	_ = os.MkdirAll(dir, 0o755)
	defer os.RemoveAll(dir)
	prefix := stressScenario + "." + subject
	spec := workerSpec{
		Name: "stress", Subject: subject, Store: dir, Sink: r.sink.base, Task: "consumer-group-1",
		LeaseMS: 2000, TimeoutMS: 1000, BudgetMS: 60_000,
		Stress: &stressSpec{Prefix: prefix, Messages: r.cfg.StressMessages, DupRate: 0.3, Consumers: 50, Seed: r.cfg.Seed},
	}
	if subject == subjectToolfencePostgres {
		spec.Store, spec.Schema = r.cfg.PostgresDSN, r.schema
	}
	byIntent := map[string][]Belief{}
	var runErr string
	b, _ := jsonMarshal(spec)
	p, err := startProc(r.cfg.Command("worker", "--spec", string(b)))
	if err == nil {
		var bs []Belief
		bs, err = p.wait(30 * time.Minute)
		for _, b := range bs {
			byIntent[b.Intent] = append(byIntent[b.Intent], b)
		}
	}
	if err != nil {
		runErr = err.Error()
	}
	elapsed := time.Since(t0) / time.Duration(max(r.cfg.StressMessages, 1))
	for i := range r.cfg.StressMessages {
		st.put(stressScenario, subject, i, byIntent[stressIntent(prefix, i)], nil, runErr, elapsed)
	}
}

// TrialResult is one graded trial.
type TrialResult struct {
	Scenario string        `json:"scenario"`
	Subject  string        `json:"subject"`
	Index    int           `json:"index"`
	Intent   string        `json:"intent"`
	Grade    Grade         `json:"grade"`
	Beliefs  []Belief      `json:"beliefs"`
	Notes    []string      `json:"notes,omitempty"`
	Error    string        `json:"error,omitempty"`
	Elapsed  time.Duration `json:"elapsed_ns"`
}

// Run runs every selected cell Trials times, grades each trial from the sink's log and
// returns the report (also written to cfg.Out when set). It returns an error when the
// sink cannot run or the configuration is unusable; failing trials are in the report.
func Run(ctx context.Context, cfg Options) (*Report, error) {
	if cfg.Command == nil {
		return nil, invalidOptions("Command is required")
	}
	cfg.Trials = cmp.Or(cfg.Trials, 4)
	cfg.Seed = cmp.Or(cfg.Seed, 1)
	cfg.Parallel = cmp.Or(cfg.Parallel, 2)
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, 500*time.Millisecond)
	cfg.StressMessages = cmp.Or(cfg.StressMessages, 500)
	cfg.Batch = cmp.Or(cfg.Batch, min(cfg.Trials, 500))
	if cfg.Trials < 0 || cfg.Batch < 0 || cfg.Parallel < 0 {
		return nil, invalidOptions("Trials, Batch and Parallel must not be negative")
	}
	cfg.HostRevision = cmp.Or(cfg.HostRevision, HostRevisions[0])
	if !slices.Contains(HostRevisions, cfg.HostRevision) {
		return nil, invalidOptions("HostRevision %q: the proxy subjects' host speaks %s", cfg.HostRevision, strings.Join(HostRevisions, " or "))
	}
	scens, subs, err := selectCells(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.WorkDir == "" {
		dir, err := os.MkdirTemp("", "toolfence-eval-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		cfg.WorkDir = dir
	}
	for _, d := range []string{"stores", "specs"} {
		if err := os.MkdirAll(filepath.Join(cfg.WorkDir, d), 0o755); err != nil {
			return nil, err
		}
	}
	started := time.Now()
	logPath := filepath.Join(cfg.WorkDir, "sink.log")
	sinkProc, err := startProc(cfg.Command("sink", "--addr", "127.0.0.1:0", "--log", logPath, "--exit-on-stdin-eof"))
	if err != nil {
		return nil, err
	}
	defer sinkProc.kill()
	select {
	case <-sinkProc.gotLine:
	case <-time.After(10 * time.Second):
		return nil, errors.New("evals: the sink did not start")
	}
	sinkProc.mu.Lock()
	base := sinkProc.first
	sinkProc.mu.Unlock()
	if !strings.HasPrefix(base, "http://") {
		return nil, fmt.Errorf("evals: the sink did not start: %q %s", base, sinkProc.stderrTail())
	}
	r := &runner{cfg: cfg, sink: sinkClient{base: base, hc: &http.Client{}},
		schema: fmt.Sprintf("toolfence_eval_%d", time.Now().UnixNano())}

	if cfg.PostgresDSN != "" && slices.Contains(subs, subjectToolfencePostgres) {
		defer func() { _ = dropSchema(cfg.PostgresDSN, r.schema) }()
	}
	if slices.ContainsFunc(subs, isProxySubject) {
		if err := r.writeProxyPolicy(); err != nil {
			return nil, err
		}
	}
	st := newStore()
	var batches []*batch
	stress := false
	steps := 0
	for _, sc := range scens {
		if sc.Name == stressScenario {
			stress = true
			for _, sub := range subs {
				if runs(sc.Name, sub) {
					st.addCell(sc.Name, sub, cfg.StressMessages)
					steps++
				}
			}
			continue
		}
		for _, sub := range subs {
			if !runs(sc.Name, sub) {
				continue
			}
			steps += cfg.Trials
			st.addCell(sc.Name, sub, cfg.Trials)
			for k, lo := 0, 0; lo < cfg.Trials; k, lo = k+1, lo+cfg.Batch {
				idx := make([]int, 0, cfg.Batch)
				for i := lo; i < min(lo+cfg.Batch, cfg.Trials); i++ {
					idx = append(idx, i)
				}
				batches = append(batches, newBatch(r, sc.Name, sub, k, idx))
			}
		}
	}
	rand.New(rand.NewSource(cfg.Seed)).Shuffle(len(batches), func(i, j int) { batches[i], batches[j] = batches[j], batches[i] })
	byName := map[string]Scenario{}
	for _, sc := range scens {
		byName[sc.Name] = sc
	}

	bar := newProgress(cfg.Progress, steps)
	var wg sync.WaitGroup
	next := make(chan *batch)
	for range cfg.Parallel {
		wg.Go(func() {
			for b := range next {
				t0 := time.Now()
				if b.Subject != subjectToolfencePostgres {
					_ = os.MkdirAll(b.store, 0o755)
				}
				err := byName[b.Scenario].run(ctx, b)
				elapsed := time.Since(t0)
				for _, t := range b.trials {
					var harness string
					if err != nil {
						harness = err.Error()
					}
					st.put(b.Scenario, b.Subject, t.Index, t.Beliefs, t.Notes, harness, elapsed)
				}
				b.cleanup()
				bar.add(len(b.trials), b.Scenario+" × "+b.Subject)
			}
		})
	}
	for _, b := range batches {
		if ctx.Err() != nil {
			break
		}
		next <- b
	}
	close(next)
	wg.Wait()
	batches = nil
	if stress {
		for _, sub := range subs {
			if ctx.Err() != nil {
				break
			}
			if !runs(stressScenario, sub) {
				continue
			}
			r.stress(sub, st)
			bar.add(1, stressScenario+" × "+sub)
		}
	}
	bar.done()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	// Every worker has exited. Closing its stdin stops the sink, which drains before it
	// exits (queued jobs record their outcome): once it has exited, its log is complete.
	if err := stopSink(sinkProc, time.Minute); err != nil {
		return nil, err
	}
	if err := scanLogFile(logPath, func(rec record) error { st.addRecord(rec); return nil }); err != nil {
		return nil, err
	}
	rep := gradeAll(cfg, scens, subs, st, time.Since(started))
	if cfg.Out != "" {
		if err := rep.write(cfg.Out); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// stopSink closes the sink's stdin and waits for it to drain and exit. It returns an error,
// after killing the sink, when it has not exited within timeout, and when it exited with
// a failure: grading from an incomplete log would count effects as missing.
func stopSink(p *proc, timeout time.Duration) error {
	_ = p.stdin.Close()
	if !p.exitWithin(timeout) {
		return fmt.Errorf("evals: the sink did not drain within %v: %s", timeout, p.stderrTail())
	}
	if p.waitErr != nil {
		return fmt.Errorf("evals: the sink failed: %v: %s", p.waitErr, p.stderrTail())
	}
	return nil
}

// gradeAll grades every trial from its sink records and beliefs, tallies the cells and
// keeps the trials the report lists: all of them up to keepAllTrials trials; beyond, every
// toolfence trial that is not EXACTLY_ONCE, every trial with a harness error or a note, and
// the first keepPerBaselineCell trials of each baseline cell that are not EXACTLY_ONCE.
func gradeAll(cfg Options, scens []Scenario, subs []string, st *store, d time.Duration) *Report {
	total := 0 // trials, not stress messages
	for c, slots := range st.slots {
		if st.names[c][0] != stressScenario {
			total += len(slots)
		}
	}
	keepAll := total <= keepAllTrials
	var kept []TrialResult
	cells := make([]Cell, 0, len(st.slots))
	omitted := 0
	for c, slots := range st.slots {
		sc, sub := st.names[c][0], st.names[c][1]
		cell := Cell{Scenario: sc, Subject: sub, Counts: map[Outcome]int{}}
		baselineKept := 0
		for i := range slots {
			sl := &slots[i]
			intent := fmt.Sprintf("inv-%s.%s.b%d.%d", sc, sub, i/cfg.Batch, i)
			if sc == stressScenario {
				intent = stressIntent(stressScenario+"."+sub, i)
			}
			beliefs := st.beliefs(intent, sl, sc == stressScenario)
			g := gradeTrial(intent, st.records(intent, sl), beliefs)
			res := TrialResult{Scenario: sc, Subject: sub, Index: i, Intent: intent, Beliefs: beliefs, Elapsed: sl.elapsed}
			if sl.extra != nil {
				res.Notes, res.Error = sl.extra.notes, sl.extra.err
			}
			if res.Error != "" && g.Outcome == Blocked {
				g.Detail = strings.TrimSpace(g.Detail + " harness: " + res.Error)
			}
			res.Grade = g
			cell.Trials++
			cell.Counts[g.Outcome]++
			cell.Reconciled += g.Reconciled
			if res.Error != "" {
				cell.HarnessErrors++
			}
			notable := len(res.Notes) > 0 && !onlyModeNote(res.Notes) || res.Error != ""
			switch {
			case keepAll, notable, g.Outcome != ExactlyOnce && isToolfence(sub):
				kept = append(kept, res)
			case g.Outcome != ExactlyOnce && baselineKept < keepPerBaselineCell:
				kept = append(kept, res)
				baselineKept++
			default:
				omitted++
				cell.Omitted++
			}
			*sl = slot{} // graded: let it go
		}
		cells = append(cells, cell)
	}
	slices.SortFunc(kept, func(a, b TrialResult) int {
		return cmp.Or(cmp.Compare(a.Scenario, b.Scenario), cmp.Compare(a.Subject, b.Subject), cmp.Compare(a.Index, b.Index))
	})
	return newReport(cfg, scens, subs, cells, kept, omitted, d)
}

// onlyModeNote reports whether notes are just the queued-202 scenario's record of the mode
// it chose (every trial of it has one): that alone does not keep a trial in a large report.
func onlyModeNote(notes []string) bool {
	return len(notes) == 1 && strings.HasPrefix(notes[0], "mode ")
}

// invalidOptions is the error of Run for unusable Options (unknown scenario or subject
// names, nothing selected, no Command): "evals: invalid options: " and the detail, wrapping
// interceptor.ErrInvalidOptions.
func invalidOptions(format string, args ...any) error {
	return interceptor.InvalidOptions("evals: invalid options", format, args...)
}

func selectCells(cfg Options) ([]Scenario, []string, error) {
	var scens []Scenario
	for _, sc := range scenarios {
		if len(cfg.Scenarios) == 0 || slices.Contains(cfg.Scenarios, sc.Name) {
			scens = append(scens, sc)
		}
	}
	for _, name := range cfg.Scenarios {
		if !slices.ContainsFunc(scenarios, func(s Scenario) bool { return s.Name == name }) {
			return nil, nil, invalidOptions("unknown scenario %q", name)
		}
	}
	var subs []string
	for _, s := range allSubjects {
		if len(cfg.Subjects) > 0 && !slices.Contains(cfg.Subjects, s) {
			continue
		}
		if s == subjectToolfencePostgres && cfg.PostgresDSN == "" {
			if len(cfg.Subjects) > 0 {
				return nil, nil, invalidOptions("toolfence-postgres needs a PostgreSQL DSN that answers")
			}
			continue
		}
		subs = append(subs, s)
	}
	for _, name := range cfg.Subjects {
		if !slices.Contains(allSubjects, name) {
			return nil, nil, invalidOptions("unknown subject %q", name)
		}
	}
	if len(scens) == 0 || len(subs) == 0 {
		return nil, nil, invalidOptions("no cell selected")
	}
	return scens, subs, nil
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// progress draws a one-line bar on a terminal-ish writer.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	total int
	n     int
	start time.Time
}

// newProgress draws on w: a redrawn bar on a terminal, a line per 10 % otherwise.
func newProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total, start: time.Now()}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// add counts n more finished steps (trials, or a stress cell).
func (p *progress) add(n int, label string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	prev := p.n
	p.n += n
	if p.w == nil {
		return
	}
	const width = 30
	fill := min(p.n, p.total) * width / max(p.total, 1)
	if !p.tty {
		if p.n*10/max(p.total, 1) != prev*10/max(p.total, 1) || p.n == p.total {
			fmt.Fprintf(p.w, "[%s%s] %d/%d %5.1fs\n", strings.Repeat("=", fill), strings.Repeat(" ", width-fill),
				p.n, p.total, time.Since(p.start).Seconds())
		}
		return
	}
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d %5.1fs %-40.40s", strings.Repeat("=", fill), strings.Repeat(" ", width-fill),
		p.n, p.total, time.Since(p.start).Seconds(), label)
}

func (p *progress) done() {
	if p.w != nil && p.tty {
		fmt.Fprintln(p.w)
	}
}
