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
)

// Config configures Run. Command is required; every other field has a default.
type Config struct {
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
	// Parallel is how many trials run at once. Defaults to 2.
	Parallel int
	// LeaseTTL is the toolfence lease and the baselines' pending TTL. Defaults to 500ms.
	LeaseTTL time.Duration
	// StressMessages is the message count of the stress-003 scenario. Defaults to 500.
	StressMessages int
	// WorkDir holds the stores and the sink log. Defaults to a new temporary directory,
	// removed at the end.
	WorkDir string
}

// AllSubjects lists the subjects in report order.
var AllSubjects = []string{
	SubjectToolfenceBadger, SubjectToolfencePostgres, SubjectToolfenceNoProbe, SubjectNone, SubjectRecordAfter,
	SubjectCheckThenInsert, SubjectExpiring, SubjectMarkBefore,
}

type runner struct {
	cfg    Config
	sink   sinkClient
	schema string
}

func (r *runner) workerTimeout() time.Duration { return 20*r.cfg.LeaseTTL + 10*time.Second }

func (r *runner) rngFor(t *trial) *rand.Rand {
	h := r.cfg.Seed
	for _, c := range t.Scenario + "/" + t.Subject {
		h = h*31 + int64(c)
	}
	return rand.New(rand.NewSource(h*1_000_003 + int64(t.Index)))
}

// waitHeld waits until the sink holds intent's answer, or the worker exits first.
func (r *runner) waitHeld(ctx context.Context, p *proc, intent string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- r.sink.waitHeld(ctx, intent, r.workerTimeout()) }()
	select {
	case err := <-errc:
		return err
	case <-p.done:
		return fmt.Errorf("worker exited before the sink held its answer: %s", p.stderrTail())
	}
}

// stress runs the seed-003 stress test against one subject in one worker process and
// returns one result (and the beliefs) per message.
func (r *runner) stress(subject string) ([]TrialResult, [][]Belief) {
	t0 := time.Now()
	dir := filepath.Join(r.cfg.WorkDir, "stores", StressScenario+"."+subject)
	_ = os.MkdirAll(dir, 0o755)
	defer os.RemoveAll(dir)
	prefix := StressScenario + "." + subject
	spec := WorkerSpec{
		Name: "stress", Subject: subject, Store: dir, Sink: r.sink.base, Task: "consumer-group-1",
		LeaseMS: 2000, TimeoutMS: 1000, BudgetMS: 60_000,
		Stress: &StressSpec{Prefix: prefix, Messages: r.cfg.StressMessages, DupRate: 0.3, Consumers: 50, Seed: r.cfg.Seed},
	}
	if subject == SubjectToolfencePostgres {
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
	elapsed := time.Since(t0)
	results := make([]TrialResult, r.cfg.StressMessages)
	beliefs := make([][]Belief, r.cfg.StressMessages)
	for i := range results {
		intent := StressIntent(prefix, i)
		results[i] = TrialResult{Scenario: StressScenario, Subject: subject, Index: i, Intent: intent,
			Beliefs: byIntent[intent], Error: runErr, Elapsed: elapsed / time.Duration(len(results))}
		beliefs[i] = byIntent[intent]
	}
	return results, beliefs
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
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Command == nil {
		return nil, fmt.Errorf("%w: Command is required", ErrInvalidConfig)
	}
	cfg.Trials = cmp.Or(cfg.Trials, 4)
	cfg.Seed = cmp.Or(cfg.Seed, 1)
	cfg.Parallel = cmp.Or(cfg.Parallel, 2)
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, 500*time.Millisecond)
	cfg.StressMessages = cmp.Or(cfg.StressMessages, 500)
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
	if err := os.MkdirAll(filepath.Join(cfg.WorkDir, "stores"), 0o755); err != nil {
		return nil, err
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

	if cfg.PostgresDSN != "" && slices.Contains(subs, SubjectToolfencePostgres) {
		defer func() { _ = dropSchema(cfg.PostgresDSN, r.schema) }()
	}
	var trials []*trial
	stress := false
	for _, sc := range scens {
		if sc.Name == StressScenario {
			stress = true
			continue
		}
		for _, sub := range subs {
			for i := range cfg.Trials {
				id := fmt.Sprintf("%s.%s.%d", sc.Name, sub, i)
				trials = append(trials, &trial{r: r, Scenario: sc.Name, Subject: sub, Index: i,
					Intent: "inv-" + id, Task: "task-" + id, store: filepath.Join(cfg.WorkDir, "stores", id)})
			}
		}
	}
	rand.New(rand.NewSource(cfg.Seed)).Shuffle(len(trials), func(i, j int) { trials[i], trials[j] = trials[j], trials[i] })
	byName := map[string]Scenario{}
	for _, sc := range scens {
		byName[sc.Name] = sc
	}

	results := make([]TrialResult, len(trials))
	beliefs := make([][]Belief, len(trials))
	steps := len(trials)
	if stress {
		steps += len(subs)
	}
	bar := newProgress(cfg.Progress, steps)
	var wg sync.WaitGroup
	next := make(chan int)
	for range cfg.Parallel {
		wg.Go(func() {
			for i := range next {
				t := trials[i]
				t0 := time.Now()
				if !IsToolfence(t.Subject) || t.Subject == SubjectToolfenceBadger {
					_ = os.MkdirAll(t.store, 0o755)
				}
				bs, err := byName[t.Scenario].run(ctx, t)
				res := TrialResult{Scenario: t.Scenario, Subject: t.Subject, Index: t.Index, Intent: t.Intent,
					Beliefs: bs, Notes: t.Notes, Elapsed: time.Since(t0)}
				if err != nil {
					res.Error = err.Error()
				}
				results[i], beliefs[i] = res, bs
				_ = os.RemoveAll(t.store)
				bar.step(t.Scenario + " × " + t.Subject)
			}
		})
	}
	for i := range trials {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if stress {
		for _, sub := range subs {
			if ctx.Err() != nil {
				break
			}
			rs, bs := r.stress(sub)
			results, beliefs = append(results, rs...), append(beliefs, bs...)
			bar.step(StressScenario + " × " + sub)
		}
	}
	bar.done()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	// Let queued jobs finish, then stop the sink and grade from its log file.
	time.Sleep(300 * time.Millisecond)
	_ = sinkProc.stdin.Close()
	select {
	case <-sinkProc.done:
	case <-time.After(5 * time.Second):
		sinkProc.kill()
	}
	recs, err := ReadLogFile(logPath)
	if err != nil {
		return nil, err
	}
	byIntent := map[string][]Record{}
	for _, rec := range recs {
		byIntent[rec.Intent] = append(byIntent[rec.Intent], rec)
	}
	for i := range results {
		results[i].Grade = GradeTrial(results[i].Intent, byIntent[results[i].Intent], beliefs[i])
		if results[i].Error != "" && results[i].Grade.Outcome == Blocked {
			results[i].Grade.Detail = strings.TrimSpace(results[i].Grade.Detail + " harness: " + results[i].Error)
		}
	}
	slices.SortFunc(results, func(a, b TrialResult) int {
		return cmp.Or(cmp.Compare(a.Scenario, b.Scenario), cmp.Compare(a.Subject, b.Subject), cmp.Compare(a.Index, b.Index))
	})
	rep := newReport(cfg, scens, subs, results, time.Since(started))
	if cfg.Out != "" {
		if err := rep.Write(cfg.Out); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// ErrInvalidConfig is wrapped by Run's errors for an unusable Config (unknown scenario or
// subject names, nothing selected, no Command).
var ErrInvalidConfig = errors.New("evals: invalid config")

func selectCells(cfg Config) ([]Scenario, []string, error) {
	var scens []Scenario
	for _, sc := range Scenarios {
		if len(cfg.Scenarios) == 0 || slices.Contains(cfg.Scenarios, sc.Name) {
			scens = append(scens, sc)
		}
	}
	for _, name := range cfg.Scenarios {
		if !slices.ContainsFunc(Scenarios, func(s Scenario) bool { return s.Name == name }) {
			return nil, nil, fmt.Errorf("%w: unknown scenario %q", ErrInvalidConfig, name)
		}
	}
	var subs []string
	for _, s := range AllSubjects {
		if len(cfg.Subjects) > 0 && !slices.Contains(cfg.Subjects, s) {
			continue
		}
		if s == SubjectToolfencePostgres && cfg.PostgresDSN == "" {
			if len(cfg.Subjects) > 0 {
				return nil, nil, fmt.Errorf("%w: toolfence-postgres needs a PostgreSQL DSN that answers", ErrInvalidConfig)
			}
			continue
		}
		subs = append(subs, s)
	}
	for _, name := range cfg.Subjects {
		if !slices.Contains(AllSubjects, name) {
			return nil, nil, fmt.Errorf("%w: unknown subject %q", ErrInvalidConfig, name)
		}
	}
	if len(scens) == 0 || len(subs) == 0 {
		return nil, nil, fmt.Errorf("%w: no cell selected", ErrInvalidConfig)
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

func (p *progress) step(label string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	if p.w == nil {
		return
	}
	const width = 30
	fill := p.n * width / max(p.total, 1)
	if !p.tty {
		if p.n*10/max(p.total, 1) != (p.n-1)*10/max(p.total, 1) || p.n == p.total {
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
