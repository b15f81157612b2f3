package evals

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// Scenario is one way of hurting a guarded call. Run drives the worker processes of one
// batch of trials and hands every trial the beliefs of its agents that finished; an error
// is a harness error of every trial of the batch.
type Scenario struct {
	Name string
	// Doc says what the scenario does, for the report and docs/evals.md.
	Doc string
	run func(ctx context.Context, b *batch) error
}

// scenarios lists every scenario in report order.
var scenarios = []Scenario{
	{Name: "crash-b0", Doc: "SIGKILL before the guard reserves anything; a successor retries the task.", run: crashAt(barrierB0)},
	{Name: "crash-reserved", Doc: "SIGKILL after the reservation, before the dispatch; a successor retries.", run: crashAt(barrierReserved)},
	{Name: "crash-b1", Doc: "SIGKILL after the sink performed the effect, before the worker got the answer (the sink holds it); a successor retries.", run: crashB1(false)},
	{Name: "crash-b2", Doc: "SIGKILL after the guarded call returned (commit and release done), before the agent reported; a successor retries.", run: crashAt(barrierB2)},
	{Name: "lost-response", Doc: "The sink performs the effect and closes the connection without an answer; the same worker retries.", run: single(modeDrop)},
	{Name: "timeout", Doc: "The sink performs the effect and hangs past the client's timeout; the same worker retries.", run: single(modeHang)},
	{Name: "fail-after-effect", Doc: "The sink performs the effect and answers 500; the same worker retries.", run: single(modeFail)},
	{Name: "queued-202", Doc: "The sink answers 202 with a job that completes later (or, in half the trials, fails with no effect); the worker follows up.", run: queued},
	{Name: "zombie", Doc: "SIGSTOP the worker while the sink holds its answer, past the lease; a successor takes over; then the answer is released and the zombie continued (SIGCONT): its late commit must be refused. A last successor checks the final state.", run: zombie},
	{Name: "concurrent", Doc: "4 agents run the same task at once (badger: 4 goroutines in one process, the store is locked to one process; otherwise 4 processes).", run: concurrent},
	{Name: "payload-drift", Doc: "SIGKILL at b1, then the successor re-words the arguments (same target, different text).", run: crashB1(true)},
	{Name: "ledger-down", Doc: "The ledger / idempotency store is unreachable for the first worker; it comes back for the successor.", run: ledgerDown},
	{Name: stressScenario, Doc: "At-least-once redelivery under load: N messages (default 500, full run 10,000), 30 % of them delivered twice, shuffled, consumed by 50 concurrent consumers (goroutines of one process per subject). Counted per message, not per trial."},
}

// stressScenario names the redelivery stress test (N messages, 30 % of them delivered
// twice, consumed concurrently), whose cells count messages, not trials.
const stressScenario = "stress-redelivery"

// trial is one run of one scenario against one subject: the unit of grading. It has its
// own task, intent, payload and agents; it shares its worker processes with the other
// trials of its batch.
type trial struct {
	Index   int
	Intent  string
	Task    string
	Notes   []string
	Beliefs []Belief
}

func (t *trial) note(format string, args ...any) {
	t.Notes = append(t.Notes, fmt.Sprintf(format, args...))
}

// text is the trial's payload wording.
func (t *trial) text() string { return "charge invoice " + t.Intent + " 42.00 EUR" }

// batch is the trials of one scenario × subject cell that share worker processes: every
// process of a batch carries all its trials at once, so they live, stop at a barrier and
// die together, and they share the batch's store directory.
type batch struct {
	r        *runner
	Scenario string
	Subject  string
	// ID is "<scenario>.<subject>.b<k>"; every intent of the batch starts with "inv-"+ID+".".
	ID       string
	trials   []*trial
	byIntent map[string]*trial
	store    string
	// specs are the spec files of the batch's workers, removed with the batch.
	specs []string
}

// newBatch returns batch k of the cell with the trials of the given indexes.
func newBatch(r *runner, scenario, subject string, k int, indexes []int) *batch {
	b := &batch{r: r, Scenario: scenario, Subject: subject, ID: fmt.Sprintf("%s.%s.b%d", scenario, subject, k),
		byIntent: make(map[string]*trial, len(indexes))}
	b.store = filepath.Join(r.cfg.WorkDir, "stores", b.ID)
	for _, i := range indexes {
		t := &trial{Index: i, Intent: fmt.Sprintf("inv-%s.%d", b.ID, i), Task: fmt.Sprintf("task-%s.%s.%d", scenario, subject, i)}
		b.trials = append(b.trials, t)
		b.byIntent[t.Intent] = t
	}
	return b
}

// cleanup removes the batch's store directory and spec files.
func (b *batch) cleanup() {
	_ = os.RemoveAll(b.store)
	for _, p := range b.specs {
		_ = os.Remove(p)
	}
}

// prefix is what every intent of the batch starts with (for the sink's batched control).
func (b *batch) prefix() string { return "inv-" + b.ID + "." }

// noteAll notes the same thing on every trial of the batch.
func (b *batch) noteAll(format string, args ...any) {
	for _, t := range b.trials {
		t.note(format, args...)
	}
}

// timeout is how long a worker process of the batch may run: it grows with the batch.
func (b *batch) timeout() time.Duration {
	return b.r.workerTimeout() + time.Duration(len(b.trials))*50*time.Millisecond
}

// spec returns the worker spec of a process named name carrying every trial of the batch;
// each, when set, adjusts a trial's part of it.
func (b *batch) spec(name string, each func(t *trial, ts *trialSpec)) workerSpec {
	lease := b.r.cfg.LeaseTTL
	s := workerSpec{
		Name: name, Subject: b.Subject, Store: b.store, Sink: b.r.sink.base,
		LeaseMS: int(lease / time.Millisecond), TimeoutMS: int(lease / 2 / time.Millisecond),
		// Every trial of the batch starts at once: the budget grows with the batch.
		BudgetMS: int((8*lease + time.Duration(len(b.trials))*10*time.Millisecond) / time.Millisecond),
	}
	if b.Subject == subjectToolfencePostgres {
		s.Store, s.Schema = b.r.cfg.PostgresDSN, b.r.schema
	}
	for _, t := range b.trials {
		ts := trialSpec{Task: t.Task, Intent: t.Intent, Text: t.text()}
		if each != nil {
			each(t, &ts)
		}
		s.Batch = append(s.Batch, ts)
	}
	if isProxySubject(b.Subject) {
		s.Proxy = b.proxyCommand(slices.ContainsFunc(s.Batch, func(ts trialSpec) bool { return ts.Hold }))
		s.HostRevision = b.r.cfg.HostRevision
	}
	return s
}

// start starts a worker process of the batch (the spec goes through a file: a batch's spec
// is larger than one argument may be).
func (b *batch) start(s workerSpec) (*proc, error) {
	js, err := jsonMarshal(s)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(b.r.cfg.WorkDir, "specs", fmt.Sprintf("%s.%s.%d.json", b.ID, s.Name, len(b.specs)))
	b.specs = append(b.specs, path)
	if err := os.WriteFile(path, js, 0o644); err != nil {
		return nil, err
	}
	cmd := b.r.cfg.Command("worker", "--spec-file", path)
	if isProxySubject(b.Subject) {
		// The host and the proxy it starts are one process group: a SIGKILL or SIGSTOP of
		// the worker hits the proxy too (the upstream runs in a group of its own).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return startProcGroup(cmd)
	}
	return startProc(cmd)
}

// collect hands every belief to the trial of its intent.
func (b *batch) collect(bs []Belief) {
	for _, bl := range bs {
		if t := b.byIntent[bl.Intent]; t != nil {
			t.Beliefs = append(t.Beliefs, bl)
		}
	}
}

// wait waits for p to exit and collects its beliefs.
func (b *batch) wait(p *proc) error {
	bs, err := p.wait(b.timeout())
	b.collect(bs)
	return err
}

// runToEnd runs one worker process to completion and collects its beliefs.
func (b *batch) runToEnd(s workerSpec) error {
	p, err := b.start(s)
	if err != nil {
		return err
	}
	return b.wait(p)
}

// noteMissed notes, on every trial not in reached, that the worker named name did not
// reach what the parent waited for.
func (b *batch) noteMissed(name string, reached map[int]bool, err error) {
	for k, t := range b.trials {
		if !reached[k] {
			t.note("%s: %v", name, err)
		}
	}
}

// waitHeld waits until the sink holds the first answer of every trial of the batch. A
// trial whose agent finished without a held answer stops the wait from waiting for it;
// the process exiting or the timeout ends the wait. It returns the trials (batch indexes)
// whose answer is held, with an error when not all are.
func (b *batch) waitHeld(ctx context.Context, p *proc) (map[int]bool, error) {
	deadline := time.Now().Add(b.timeout())
	for {
		done := p.finished()
		held, err := b.r.sink.heldIntents(ctx, b.prefix(), len(b.trials)-len(done), 200*time.Millisecond)
		if err == nil || ctx.Err() != nil {
			got := map[int]bool{}
			for k, t := range b.trials {
				if held[t.Intent] {
					got[k] = true
				}
			}
			if len(got) == len(b.trials) {
				return got, nil
			}
			if len(got)+len(done) >= len(b.trials) || ctx.Err() != nil {
				return got, fmt.Errorf("the sink holds %d of %d answers; the others finished first", len(got), len(b.trials))
			}
		}
		select {
		case <-p.done:
			held, _ := b.r.sink.heldIntents(ctx, b.prefix(), 0, 0)
			got := map[int]bool{}
			for k, t := range b.trials {
				if held[t.Intent] {
					got[k] = true
				}
			}
			return got, fmt.Errorf("worker exited before the sink held its answer: %s", p.stderrTail())
		default:
		}
		if time.Now().After(deadline) {
			held, _ := b.r.sink.heldIntents(ctx, b.prefix(), 0, 0)
			got := map[int]bool{}
			for k, t := range b.trials {
				if held[t.Intent] {
					got[k] = true
				}
			}
			return got, fmt.Errorf("the sink held %d of %d answers within %v", len(got), len(b.trials), b.timeout())
		}
	}
}

func crashAt(barrier string) func(ctx context.Context, b *batch) error {
	return func(ctx context.Context, b *batch) error {
		s := b.spec("w1", nil)
		s.StopAt = barrier
		p, err := b.start(s)
		if err != nil {
			return err
		}
		// Every trial's agent 0 stops at the barrier (or finishes without reaching it); then
		// one SIGKILL kills them all there.
		reached, err := p.waitBarriers(barrier, len(b.trials), b.timeout())
		if err != nil || len(reached) < len(b.trials) {
			if err == nil {
				err = fmt.Errorf("finished before barrier %s", barrier)
			}
			b.noteMissed("w1", reached, err)
		}
		p.kill()
		b.collect(p.beliefs())
		return b.runToEnd(b.spec("w2", nil))
	}
}

func crashB1(drift bool) func(ctx context.Context, b *batch) error {
	return func(ctx context.Context, b *batch) error {
		p, err := b.start(b.spec("w1", func(_ *trial, ts *trialSpec) { ts.Hold = true }))
		if err != nil {
			return err
		}
		held, err := b.waitHeld(ctx, p)
		if err != nil {
			b.noteMissed("w1", held, err)
		}
		// Every answer is held: one SIGKILL kills every trial at b1.
		p.kill()
		_ = b.r.sink.releaseAll(ctx, b.prefix(), "drop")
		b.collect(p.beliefs())
		return b.runToEnd(b.spec("w2", func(t *trial, ts *trialSpec) {
			if drift {
				ts.Text = "Please bill 42 EUR for invoice " + t.Intent + " (re-worded)"
			}
		}))
	}
}

func single(mode string) func(ctx context.Context, b *batch) error {
	return func(ctx context.Context, b *batch) error {
		return b.runToEnd(b.spec("w1", func(_ *trial, ts *trialSpec) { ts.Mode = mode }))
	}
}

func queued(ctx context.Context, b *batch) error {
	return b.runToEnd(b.spec("w1", func(t *trial, ts *trialSpec) {
		ts.Mode = modeQueued
		if b.r.rngFor(b.Scenario, b.Subject, t.Index).Intn(2) == 1 {
			ts.Mode = modeQueuedFail
		}
		t.note("mode %s", ts.Mode)
	}))
}

func zombie(ctx context.Context, b *batch) error {
	p, err := b.start(b.spec("w1", func(_ *trial, ts *trialSpec) { ts.Hold = true }))
	if err != nil {
		return err
	}
	held, err := b.waitHeld(ctx, p)
	if err != nil {
		b.noteMissed("w1", held, err)
	}
	// Every trial's first worker is stopped while the sink holds its answer.
	if err := p.signal(syscall.SIGSTOP); err != nil {
		p.kill()
		return err
	}
	time.Sleep(b.r.cfg.LeaseTTL + 150*time.Millisecond) // past every lease, in real time
	if err := b.runToEnd(b.spec("w2", nil)); err != nil {
		b.noteAll("w2: %v", err)
	}
	_ = b.r.sink.releaseAll(ctx, b.prefix(), "respond")
	_ = p.signal(syscall.SIGCONT)
	if err := b.wait(p); err != nil {
		b.noteAll("zombie: %v", err)
	}
	return b.runToEnd(b.spec("w3", nil))
}

func concurrent(ctx context.Context, b *batch) error {
	const n = 4
	if b.Subject == subjectToolfenceBadger || b.Subject == subjectToolfenceNoProbe {
		s := b.spec("w", nil)
		s.Agents = n
		return b.runToEnd(s)
	}
	procs := make([]*proc, 0, n)
	for i := range n {
		p, err := b.start(b.spec(fmt.Sprintf("w%d", i+1), nil))
		if err != nil {
			for _, p := range procs {
				p.kill()
			}
			return err
		}
		procs = append(procs, p)
	}
	var firstErr error
	for _, p := range procs {
		if err := b.wait(p); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

func ledgerDown(ctx context.Context, b *batch) error {
	s := b.spec("w1", nil)
	switch b.Subject {
	case subjectToolfencePostgres:
		s.Store = "postgres://postgres@127.0.0.1:1/down?sslmode=disable&connect_timeout=1"
	default:
		down := b.store + ".down"
		if err := os.WriteFile(down, []byte("not a directory\n"), 0o644); err != nil {
			return err
		}
		defer os.Remove(down)
		s.Store = down
	}
	if err := b.runToEnd(s); err != nil {
		b.noteAll("w1: %v", err)
	}
	return b.runToEnd(b.spec("w2", nil))
}
