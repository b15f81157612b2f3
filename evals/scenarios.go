package evals

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Scenario is one way of hurting a guarded call. Run drives the worker processes of one
// trial and returns the beliefs of the workers that finished.
type Scenario struct {
	Name string
	// Doc says what the scenario does, for the report and docs/evals.md.
	Doc string
	run func(ctx context.Context, t *trial) ([]Belief, error)
}

// Scenarios lists every scenario in report order.
var Scenarios = []Scenario{
	{Name: "crash-b0", Doc: "SIGKILL before the guard reserves anything; a successor retries the task.", run: crashAt(BarrierB0)},
	{Name: "crash-reserved", Doc: "SIGKILL after the reservation, before the dispatch; a successor retries.", run: crashAt(BarrierReserved)},
	{Name: "crash-b1", Doc: "SIGKILL after the sink performed the effect, before the worker got the answer (the sink holds it); a successor retries.", run: crashB1(false)},
	{Name: "crash-b2", Doc: "SIGKILL after the guarded call returned (commit and release done), before the agent reported; a successor retries.", run: crashAt(BarrierB2)},
	{Name: "lost-response", Doc: "The sink performs the effect and closes the connection without an answer; the same worker retries.", run: single(ModeDrop)},
	{Name: "timeout", Doc: "The sink performs the effect and hangs past the client's timeout; the same worker retries.", run: single(ModeHang)},
	{Name: "fail-after-effect", Doc: "The sink performs the effect and answers 500; the same worker retries.", run: single(ModeFail)},
	{Name: "queued-202", Doc: "The sink answers 202 with a job that completes later (or, in half the trials, fails with no effect); the worker follows up.", run: queued},
	{Name: "zombie", Doc: "SIGSTOP the worker while the sink holds its answer, past the lease; a successor takes over; then the answer is released and the zombie continued (SIGCONT): its late commit must be refused. A last successor checks the final state.", run: zombie},
	{Name: "concurrent", Doc: "4 agents run the same task at once (badger: 4 goroutines in one process, the store is locked to one process; otherwise 4 processes).", run: concurrent},
	{Name: "payload-drift", Doc: "SIGKILL at b1, then the successor re-words the arguments (same target, different text).", run: crashB1(true)},
	{Name: "ledger-down", Doc: "The ledger / idempotency store is unreachable for the first worker; it comes back for the successor.", run: ledgerDown},
	{Name: StressScenario, Doc: "Seed 003's stress test: N messages (default 500, full run 10,000), 30 % of them delivered twice, shuffled, consumed by 50 concurrent consumers (goroutines of one process per subject). Counted per message, not per trial."},
}

// StressScenario names the seed-003 stress test, whose cells count messages.
const StressScenario = "stress-003"

// trial is one run of one scenario against one subject.
type trial struct {
	r        *runner
	Scenario string
	Subject  string
	Index    int
	Intent   string
	Task     string
	store    string
	Notes    []string
}

func (t *trial) note(format string, args ...any) {
	t.Notes = append(t.Notes, fmt.Sprintf(format, args...))
}

// spec returns the worker spec of this trial for a worker named name.
func (t *trial) spec(name string) WorkerSpec {
	s := WorkerSpec{
		Name: name, Subject: t.Subject, Store: t.store, Sink: t.r.sink.base,
		Task: t.Task, Intent: t.Intent, Text: "charge invoice " + t.Intent + " 42.00 EUR",
		LeaseMS: int(t.r.cfg.LeaseTTL / time.Millisecond), TimeoutMS: int(t.r.cfg.LeaseTTL / 2 / time.Millisecond),
		BudgetMS: int(8 * t.r.cfg.LeaseTTL / time.Millisecond),
	}
	if t.Subject == SubjectToolfencePostgres {
		s.Store, s.Schema = t.r.cfg.PostgresDSN, t.r.schema
	}
	return s
}

func (t *trial) start(s WorkerSpec) (*proc, error) {
	b, err := jsonMarshal(s)
	if err != nil {
		return nil, err
	}
	return startProc(t.r.cfg.Command("worker", "--spec", string(b)))
}

// runToEnd runs one worker to completion and returns its beliefs.
func (t *trial) runToEnd(s WorkerSpec) ([]Belief, error) {
	p, err := t.start(s)
	if err != nil {
		return nil, err
	}
	return p.wait(t.r.workerTimeout())
}

func crashAt(barrier string) func(ctx context.Context, t *trial) ([]Belief, error) {
	return func(ctx context.Context, t *trial) ([]Belief, error) {
		s := t.spec("w1")
		s.StopAt = barrier
		p, err := t.start(s)
		if err != nil {
			return nil, err
		}
		var out []Belief
		if err := p.waitBarrier(barrier, t.r.workerTimeout()); err != nil {
			t.note("w1: %v", err)
			bs, _ := p.wait(t.r.workerTimeout())
			out = append(out, bs...)
		} else {
			p.kill()
		}
		bs, err := t.runToEnd(t.spec("w2"))
		return append(out, bs...), err
	}
}

func crashB1(drift bool) func(ctx context.Context, t *trial) ([]Belief, error) {
	return func(ctx context.Context, t *trial) ([]Belief, error) {
		s := t.spec("w1")
		s.Hold = true
		p, err := t.start(s)
		if err != nil {
			return nil, err
		}
		if err := t.r.waitHeld(ctx, p, t.Intent); err != nil {
			t.note("w1: %v", err)
			p.kill()
			return nil, err
		}
		p.kill()
		_ = t.r.sink.release(ctx, t.Intent, "drop")
		s2 := t.spec("w2")
		if drift {
			s2.Text = "Please bill 42 EUR for invoice " + t.Intent + " (re-worded)"
		}
		return t.runToEnd(s2)
	}
}

func single(mode string) func(ctx context.Context, t *trial) ([]Belief, error) {
	return func(ctx context.Context, t *trial) ([]Belief, error) {
		s := t.spec("w1")
		s.Mode = mode
		return t.runToEnd(s)
	}
}

func queued(ctx context.Context, t *trial) ([]Belief, error) {
	s := t.spec("w1")
	s.Mode = ModeQueued
	if t.r.rngFor(t).Intn(2) == 1 {
		s.Mode = ModeQueuedFail
	}
	t.note("mode %s", s.Mode)
	return t.runToEnd(s)
}

func zombie(ctx context.Context, t *trial) ([]Belief, error) {
	s := t.spec("w1")
	s.Hold = true
	p, err := t.start(s)
	if err != nil {
		return nil, err
	}
	if err := t.r.waitHeld(ctx, p, t.Intent); err != nil {
		p.kill()
		return nil, err
	}
	if err := p.signal(syscall.SIGSTOP); err != nil {
		p.kill()
		return nil, err
	}
	time.Sleep(t.r.cfg.LeaseTTL + 150*time.Millisecond) // past the lease, in real time
	out, err := t.runToEnd(t.spec("w2"))
	if err != nil {
		t.note("w2: %v", err)
	}
	_ = t.r.sink.release(ctx, t.Intent, "respond")
	_ = p.signal(syscall.SIGCONT)
	bs, err := p.wait(t.r.workerTimeout())
	if err != nil {
		t.note("zombie: %v", err)
	}
	out = append(out, bs...)
	bs, err = t.runToEnd(t.spec("w3"))
	return append(out, bs...), err
}

func concurrent(ctx context.Context, t *trial) ([]Belief, error) {
	const n = 4
	if t.Subject == SubjectToolfenceBadger || t.Subject == SubjectToolfenceNoProbe {
		s := t.spec("w")
		s.Agents = n
		return t.runToEnd(s)
	}
	procs := make([]*proc, 0, n)
	for i := range n {
		p, err := t.start(t.spec(fmt.Sprintf("w%d", i+1)))
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
	}
	var out []Belief
	var firstErr error
	for _, p := range procs {
		bs, err := p.wait(t.r.workerTimeout())
		out = append(out, bs...)
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return out, firstErr
}

func ledgerDown(ctx context.Context, t *trial) ([]Belief, error) {
	s := t.spec("w1")
	switch t.Subject {
	case SubjectToolfencePostgres:
		s.Store = "postgres://postgres@127.0.0.1:1/down?sslmode=disable&connect_timeout=1"
	default:
		down := filepath.Join(filepath.Dir(t.store), filepath.Base(t.store)+".down")
		if err := os.WriteFile(down, []byte("not a directory\n"), 0o644); err != nil {
			return nil, err
		}
		s.Store = down
	}
	out, err := t.runToEnd(s)
	if err != nil {
		t.note("w1: %v", err)
	}
	bs, err := t.runToEnd(t.spec("w2"))
	return append(out, bs...), err
}
