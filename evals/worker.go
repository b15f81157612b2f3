package evals

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/toolfence/toolfence/evals/baselines"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// Barrier names, in the order a guarded call passes them.
const (
	// barrierB0 is before the guard reserves anything.
	barrierB0 = "b0"
	// barrierReserved is inside the tool, after the reservation, before the dispatch.
	barrierReserved = "reserved"
	// b1, after the sink performed the effect and before the answer reaches the worker, is
	// held by the sink, not announced by the worker: it has no constant here.
	// barrierB2 is after the guarded call returned: the terminal commit and the release
	// are done, the agent has not reported yet.
	barrierB2 = "b2"
	// barrierDone is announced when a trial's agent 0 finished (it passes no barrier after).
	barrierDone = "done"
)

// workerSpec is what one worker process runs: the guarded call of one subject for each
// trial of its batch (or for its single trial), each by one or more agents (goroutines) of
// the process, all at once.
type workerSpec struct {
	Name    string `json:"name"`
	Subject string `json:"subject"`
	// Store is the badger directory, the baseline file-store directory, or a PostgreSQL DSN.
	Store  string `json:"store"`
	Schema string `json:"schema,omitempty"`
	Sink   string `json:"sink"`
	Task   string `json:"task"`
	// Intent is the business identity (the tool's target and the sink's intent).
	Intent string `json:"intent"`
	// Text is the payload wording (payload drift changes it).
	Text string `json:"text"`
	// Mode is the sink mode of the intent's first request; Hold makes the sink hold the
	// answer of that request until the parent releases it (barrier b1).
	Mode string `json:"mode,omitempty"`
	Hold bool   `json:"hold,omitempty"`
	// StopAt names the barrier where agent 0 of every trial stops and waits to be killed.
	StopAt string `json:"stop_at,omitempty"`
	// Agents is the number of agents running the call at once in this process (default 1).
	Agents int `json:"agents,omitempty"`
	// LeaseMS is the toolfence lease (and baseline pending TTL) in milliseconds.
	LeaseMS int `json:"lease_ms"`
	// TimeoutMS is the HTTP client timeout in milliseconds.
	TimeoutMS int `json:"timeout_ms"`
	// BudgetMS is how long an agent keeps retrying before it gives up.
	BudgetMS int `json:"budget_ms"`
	// Stress, when set, replaces the single call by the redelivery stress test.
	Stress *stressSpec `json:"stress,omitempty"`
	// Batch, when set, replaces the single trial of Task, Intent, Text, Mode and Hold: the
	// process runs every trial of the batch at once, each with its own task, intent, wording,
	// sink mode and agents (with their own interceptor and holder). The trials share the
	// process (and so its kill), the store and StopAt.
	Batch []trialSpec `json:"batch,omitempty"`
	// Active bounds how many agents of the process do guarded work at once (reserving,
	// calling the sink, committing, probing); an agent sleeping, stopped at a barrier or
	// waiting for an answer the sink holds or hangs on does not count. It keeps a batch of
	// hundreds of trials from stretching every call past the lease. Defaults to 16.
	Active int `json:"active,omitempty"`
	// Proxy, for the proxy subjects, is the command of the proxy (or relay) the worker
	// starts as its MCP server, the upstream's command after "--".
	Proxy *cmdSpec `json:"proxy,omitempty"`
	// HostRevision is the MCP revision the proxy subjects' host asks for.
	HostRevision string `json:"host_revision,omitempty"`
}

// trialSpec is one trial of a batch: the identity of its call and its sink mode.
type trialSpec struct {
	Task   string `json:"task"`
	Intent string `json:"intent"`
	Text   string `json:"text"`
	Mode   string `json:"mode,omitempty"`
	Hold   bool   `json:"hold,omitempty"`
}

// stressSpec is the redelivery stress test: Messages messages, DupRate of them delivered
// twice, spread over Consumers concurrent consumers in this process; the deliveries are
// shuffled with Seed. Every message is its own intent, stressIntent(Prefix, i).
type stressSpec struct {
	Prefix    string  `json:"prefix"`
	Messages  int     `json:"messages"`
	DupRate   float64 `json:"dup_rate"`
	Consumers int     `json:"consumers"`
	Seed      int64   `json:"seed"`
}

// stressIntent names message i of a stress run.
func stressIntent(prefix string, i int) string { return fmt.Sprintf("%s.msg-%05d", prefix, i) }

// deliveries returns the shuffled message indexes to deliver, duplicates included.
func (s stressSpec) deliveries() []int {
	rng := rand.New(rand.NewSource(s.Seed))
	out := make([]int, 0, s.Messages+int(float64(s.Messages)*s.DupRate)+1)
	for i := range s.Messages {
		out = append(out, i)
		if rng.Float64() < s.DupRate {
			out = append(out, i)
		}
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// Subject names.
const (
	subjectToolfenceBadger   = "toolfence-badger"
	subjectToolfencePostgres = "toolfence-postgres"
	// subjectToolfenceNoProbe is toolfence on badger with no probe registered: unknown
	// outcomes stay blocked for a person, which is what BLOCKED costs.
	subjectToolfenceNoProbe = "toolfence-badger-noprobe"
	subjectNone             = "none"
	subjectRecordAfter      = "record-after"
	subjectCheckThenInsert  = "check-then-insert"
	subjectExpiring         = "expiring-in-progress"
	subjectMarkBefore       = "mark-before"
)

// subjectDocs says in one sentence what each subject is, for readers of the report.
var subjectDocs = map[string]string{
	subjectToolfenceBadger: "toolfence's interceptor on its embedded badger ledger, with a probe that asks the upstream " +
		"whether a call with the same Idempotency-Key reached it.",
	subjectToolfencePostgres: "the same on the PostgreSQL ledger (run only when a PostgreSQL DSN is given and answers).",
	subjectToolfenceNoProbe: "toolfence on badger with no probe registered: every unknown outcome stays blocked for a " +
		"person, which shows what BLOCKED costs.",
	subjectNone: "no guard at all: every retry calls the upstream again.",
	subjectRecordAfter: "a guard that writes its record only after the call returns and replays a completed record: " +
		"a crash between the effect and the record leaves no trace, so the retry runs again.",
	subjectCheckThenInsert: "the common idempotency middleware: a key over the method, path and raw body, a read, then " +
		"a pending insert with no unique constraint; errors reset the record and a pending record expires after " +
		"the lease and runs again.",
	subjectExpiring: "a key from the intent and an in-progress record that expires after the lease and runs the call " +
		"again; errors delete the record; no fencing tokens.",
	subjectToolfenceProxy: "`toolfence proxy` (a real process, badger store) between an MCP host and the payments MCP " +
		"server (a real process whose charges are the sink's effects), charge protected by the order id; killed " +
		"with its host. Its policy probes find_charge (the payments server's lookup of the order) to settle an unknown outcome.",
	subjectPassThrough: "the same MCP host and payments server behind a relay that forwards every byte: no guard.",
	subjectMarkBefore: "a deduplicator that marks the key done before it runs the call: a retry after a crash or an " +
		"error is dropped as already processed and reported as a success with no result.",
}

// subjectDoc says in one sentence what subject is ("" for an unknown subject).
func subjectDoc(subject string) string { return subjectDocs[subject] }

// isToolfence reports whether subject is a toolfence subject (whose failures fail the eval).
func isToolfence(subject string) bool {
	return subject == subjectToolfenceBadger || subject == subjectToolfencePostgres || subject == subjectToolfenceNoProbe ||
		subject == subjectToolfenceProxy
}

// operation is the tool name every eval call uses.
const operation = "charge"

// WorkerMain runs a worker process: it reads the spec from --spec or --spec-file (JSON),
// prints "BARRIER <trial> <agent> <name>" at every barrier (trial is the index in the
// batch, 0 for a single trial) and "RESULT <belief JSON>" per agent on stdout as soon as
// that agent is done (the belief names its intent; "BARRIER <trial> 0 done" comes first),
// and, at the barrier named by StopAt, blocks each trial's agent 0 until the process is
// killed (or stdin closes, then it exits 3). It returns the process exit code.
func WorkerMain(ctx context.Context, args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("eval-worker", flag.ContinueOnError)
	specJSON := fs.String("spec", "", "worker spec (JSON)")
	specFile := fs.String("spec-file", "", "file holding the worker spec (JSON), instead of --spec")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	raw := []byte(*specJSON)
	if *specFile != "" {
		b, err := os.ReadFile(*specFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "evals: worker: --spec-file:", err)
			return 2
		}
		raw = b
	}
	var spec workerSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		fmt.Fprintln(os.Stderr, "evals: worker: bad --spec:", err)
		return 2
	}
	active := cmp.Or(max(spec.Active, 0), 16)
	w := &worker{spec: spec, out: stdout, mu: &sync.Mutex{}, gate: newGate(active), hangs: make(chan struct{}, 4*active)}
	w.run(ctx, func(b Belief) {
		line, _ := json.Marshal(b)
		w.print("RESULT " + string(line))
	})
	return 0
}

type worker struct {
	spec  workerSpec
	mu    *sync.Mutex
	out   io.Writer
	quiet bool
	// trial is this trial's index in the batch (BARRIER lines name it).
	trial int
	// gate admits Active agents of the process to guarded work at once.
	gate *gate
	// hangs admits a bounded number of agents to a first request the sink hangs on, before
	// they reserve: hundreds of them at once would time out in the sink's queue, before it
	// performed the effect, instead of hanging after it.
	hangs chan struct{}
}

// gate admits a bounded number of agents of the process to guarded work at once, first
// come first served, with agents that already did guarded work (a reservation to commit,
// an outcome to settle) ahead of agents starting their first call: a trial that holds a
// lease is not kept waiting behind trials that have not begun.
type gate struct {
	mu     sync.Mutex
	active int
	limit  int
	urgent []chan struct{}
	normal []chan struct{}
}

func newGate(limit int) *gate { return &gate{limit: max(limit, 1)} }

// enter waits for a place; urgent waiters go first.
func (g *gate) enter(urgent bool) {
	g.mu.Lock()
	if g.active < g.limit && len(g.urgent) == 0 && (urgent || len(g.normal) == 0) {
		g.active++
		g.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	if urgent {
		g.urgent = append(g.urgent, ch)
	} else {
		g.normal = append(g.normal, ch)
	}
	g.mu.Unlock()
	<-ch // the place was handed over by leave
}

// leave gives the place to the next waiter, or frees it.
func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	var q *[]chan struct{}
	switch {
	case len(g.urgent) > 0:
		q = &g.urgent
	case len(g.normal) > 0:
		q = &g.normal
	default:
		g.active--
		return
	}
	ch := (*q)[0]
	*q = (*q)[1:]
	close(ch)
}

// ticket is one agent's place in the worker's gate: enter before guarded work, leave
// before sleeping, stopping or waiting for a held or hanging answer. Each agent runs on
// one goroutine, so a ticket needs no lock.
type ticket struct {
	gate    *gate
	in      bool
	started bool
	hangs   chan struct{}
}

func (t *ticket) enter() {
	if t != nil && t.gate != nil && !t.in {
		t.gate.enter(t.started)
		t.in, t.started = true, true
	}
}

func (t *ticket) leave() {
	if t != nil && t.in {
		t.gate.leave()
		t.in = false
	}
}

// enterHang takes a place among the agents whose first request the sink will hang on.
func (t *ticket) enterHang(hangs chan struct{}) {
	if hangs != nil {
		hangs <- struct{}{}
		t.hangs = hangs
	}
}

// leaveHang gives that place up (once).
func (t *ticket) leaveHang() {
	if t.hangs != nil {
		<-t.hangs
		t.hangs = nil
	}
}

// stdinClosed is closed when the parent closes the worker's stdin.
var stdinClosed = sync.OnceValue(func() chan struct{} {
	c := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		close(c)
	}()
	return c
})

// forMessage returns a worker for one stress delivery: same process, another intent.
func (w *worker) forMessage(intent string) *worker {
	c := *w
	c.spec.Intent, c.spec.Text, c.spec.Stress, c.quiet = intent, "deliver "+intent, nil, true
	c.gate, c.hangs = nil, nil
	return &c
}

// forTrial returns a worker for trial k of the batch: same process, the trial's identity.
func (w *worker) forTrial(k int, t trialSpec) *worker {
	c := *w
	c.spec.Task, c.spec.Intent, c.spec.Text, c.spec.Mode, c.spec.Hold = t.Task, t.Intent, t.Text, t.Mode, t.Hold
	c.spec.Batch, c.trial = nil, k
	return &c
}

// trials returns the trials this process runs: the batch, or the spec's single trial.
func (w *worker) trials() []trialSpec {
	if len(w.spec.Batch) > 0 {
		return w.spec.Batch
	}
	return []trialSpec{{Task: w.spec.Task, Intent: w.spec.Intent, Text: w.spec.Text, Mode: w.spec.Mode, Hold: w.spec.Hold}}
}

func (w *worker) print(line string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintln(w.out, line)
	if f, ok := w.out.(interface{ Sync() error }); ok {
		_ = f.Sync()
	}
}

// barrier announces that agent passed name; agent 0 of every trial stops at spec.StopAt
// (leaving the gate) until the process is killed.
func (w *worker) barrier(agent int, name string, tk *ticket) {
	if w.quiet {
		return
	}
	w.print(fmt.Sprintf("BARRIER %d %d %s", w.trial, agent, name))
	if agent == 0 && name == w.spec.StopAt {
		tk.leave()
		<-stdinClosed()
		os.Exit(3) // the parent closed stdin instead of killing us
	}
}

func (w *worker) agents() int { return max(w.spec.Agents, 1) }

// run runs the process's trials (or the stress test) and emits every agent's belief, with
// its Intent set, as soon as the agent is done.
func (w *worker) run(ctx context.Context, emit func(Belief)) {
	name := func(i int) string {
		if w.agents() == 1 {
			return w.spec.Name
		}
		return fmt.Sprintf("%s.%d", w.spec.Name, i)
	}
	failAll := func(reason string) {
		if w.spec.Stress != nil {
			emit(Belief{Worker: w.spec.Name, State: BeliefBlocked, Reason: reason})
			return
		}
		for _, t := range w.trials() {
			for i := range w.agents() {
				emit(Belief{Worker: name(i), State: BeliefBlocked, Reason: reason, Intent: t.Intent})
			}
		}
	}
	if isProxySubject(w.spec.Subject) {
		if w.spec.Proxy == nil {
			failAll("evals: a proxy subject's spec has no proxy command")
			return
		}
		w.runProxyHost(ctx, emit)
		return
	}
	var runAgent func(ctx context.Context, w *worker, i int) Belief
	switch w.spec.Subject {
	case subjectToolfenceBadger, subjectToolfencePostgres, subjectToolfenceNoProbe:
		l, err := w.openLedger(ctx)
		if err != nil {
			failAll("ledger unavailable, not dispatched: " + err.Error())
			return
		}
		defer l.Close()
		runAgent = func(ctx context.Context, w *worker, i int) Belief { return w.toolfenceAgent(ctx, l, i) }
	default:
		g, err := w.baseline()
		if err != nil {
			failAll(err.Error())
			return
		}
		runAgent = func(ctx context.Context, w *worker, i int) Belief { return w.baselineAgent(ctx, g, i) }
	}
	if w.spec.Stress != nil {
		for _, b := range w.stress(ctx, runAgent) {
			emit(b)
		}
		return
	}
	var wg sync.WaitGroup
	for k, t := range w.trials() {
		tw := w.forTrial(k, t)
		for i := range w.agents() {
			wg.Go(func() {
				b := runAgent(ctx, tw, i)
				b.Worker, b.Intent = name(i), t.Intent
				if i == 0 {
					tw.print(fmt.Sprintf("BARRIER %d 0 %s", k, barrierDone))
				}
				emit(b)
			})
		}
	}
	wg.Wait()
}

// stress delivers the stress messages to Consumers goroutines and returns one belief per
// delivery, with Intent set.
func (w *worker) stress(ctx context.Context, runAgent func(ctx context.Context, w *worker, i int) Belief) []Belief {
	st := *w.spec.Stress
	ds := st.deliveries()
	out := make([]Belief, len(ds))
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(st.Consumers, 1) {
		wg.Go(func() {
			for k := range next {
				intent := stressIntent(st.Prefix, ds[k])
				b := runAgent(ctx, w.forMessage(intent), k)
				b.Worker, b.Intent = fmt.Sprintf("delivery-%d", k), intent
				out[k] = b
			}
		})
	}
	for k := range ds {
		next <- k
	}
	close(next)
	wg.Wait()
	return out
}

func (w *worker) openLedger(ctx context.Context) (ledger.Ledger, error) {
	if w.spec.Subject == subjectToolfencePostgres {
		conns := min(w.agents()*len(w.trials())+1, 8)
		if w.spec.Stress != nil {
			conns = min(w.spec.Stress.Consumers, 20)
		}
		return postgres.Open(ctx, w.spec.Store, postgres.Options{Schema: w.spec.Schema, MaxConns: int32(conns)})
	}
	return badger.Open(w.spec.Store, badger.Options{})
}

func (w *worker) lease() time.Duration {
	return time.Duration(max(w.spec.LeaseMS, 100)) * time.Millisecond
}

func (w *worker) baseline() (baselines.Guard, error) {
	store := baselines.FileStore{Dir: w.spec.Store}
	switch w.spec.Subject {
	case subjectNone:
		return baselines.None{}, nil
	case subjectRecordAfter:
		return baselines.RecordAfter{Store: store}, nil
	case subjectCheckThenInsert:
		return baselines.CheckThenInsert{Store: store, TTL: w.lease()}, nil
	case subjectExpiring:
		return baselines.ExpiringInProgress{Store: store, TTL: w.lease()}, nil
	case subjectMarkBefore:
		return baselines.MarkBefore{Store: store}, nil
	}
	return nil, fmt.Errorf("evals: unknown subject %q", w.spec.Subject)
}

// httpClient keeps enough idle connections to the sink for a batch of concurrent agents.
var httpClient = &http.Client{Transport: &http.Transport{
	Proxy: nil, MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 30 * time.Second,
}}

// payload is the business request the sink receives.
func (w *worker) payload() []byte {
	b, _ := json.Marshal(map[string]any{"intent": w.spec.Intent, "text": w.spec.Text, "amount_cents": 4200})
	return b
}

// post sends the effect request. The first request of the process carries the spec's mode
// and hold (the sink applies them only to the intent's first request anyway).
func (w *worker) post(ctx context.Context, key, holder string, first bool) (int, []byte, error) {
	q := url.Values{}
	if first && w.spec.Mode != "" {
		q.Set("mode", w.spec.Mode)
	}
	if first && w.spec.Hold {
		q.Set("hold", "1")
	}
	var cancel context.CancelFunc
	if first && w.spec.Hold && w.spec.Mode != modeHang {
		// A held answer outlives the client timeout and the call's own deadline: the parent,
		// not the clock, decides what becomes of it (a kill, or a late answer to a zombie).
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	} else {
		ctx, cancel = context.WithTimeout(ctx, time.Duration(max(w.spec.TimeoutMS, 50))*time.Millisecond)
	}
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.spec.Sink+"/effect?"+q.Encode(), bytes.NewReader(w.payload()))
	if err != nil {
		return 0, nil, err
	}
	// Never let the transport resend the request by itself: with an Idempotency-Key header a
	// POST counts as replayable, and a resend on a dropped keep-alive connection would be a
	// second effect no agent asked for.
	req.GetBody = nil
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Holder", holder)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// postGated is post for an agent holding tk: a request the sink will hold (b1) or hang on
// leaves the gate while it waits, any other keeps its place (so a batch does not flood the
// sink with hundreds of requests at once and push them past the client timeout).
func (w *worker) postGated(ctx context.Context, tk *ticket, key, holder string, first bool) (int, []byte, error) {
	if first && (w.spec.Hold || w.spec.Mode == modeHang) {
		tk.leave()
		defer tk.enter()
		defer tk.leaveHang()
	}
	return w.post(ctx, key, holder, first)
}

// resultID extracts the effect id (or, for a queued answer, the job id) from a sink answer.
func resultID(body []byte) string {
	var a struct {
		EffectID string `json:"effect_id"`
		Job      string `json:"job"`
	}
	if json.Unmarshal(body, &a) != nil {
		return string(body)
	}
	if a.EffectID != "" {
		return a.EffectID
	}
	return a.Job
}

func (w *worker) deadline() time.Time {
	return time.Now().Add(time.Duration(max(w.spec.BudgetMS, 1000)) * time.Millisecond)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// toolfenceAgent is the agent runtime over toolfence: it calls, waits out InProgress,
// reconciles UnknownOutcome and AwaitingUpstream through the sink probe, takes the first
// result on PayloadMismatch, and gives up (blocked) when nothing settles within its budget.
func (w *worker) toolfenceAgent(ctx context.Context, l ledger.Ledger, agent int) Belief {
	holder := fmt.Sprintf("%s/%d/%d", w.spec.Name, os.Getpid(), agent)
	noProbe := w.spec.Subject == subjectToolfenceNoProbe
	op := interceptor.Operation{Probe: w.probe}
	if noProbe {
		op.Probe = nil
	}
	ic, err := interceptor.New(l, interceptor.Options{
		Namespace: "evals", Holder: holder, LeaseTTL: w.lease(),
		Operations: map[string]interceptor.Operation{operation: op},
	})
	if err != nil {
		return Belief{State: BeliefBlocked, Reason: err.Error()}
	}
	tk := &ticket{gate: w.gate}
	defer tk.leave()
	defer tk.leaveHang()
	if w.spec.Mode == modeHang {
		tk.enterHang(w.hangs)
	}
	first := true
	var firstMu sync.Mutex
	tool := func(ctx context.Context, d interceptor.Dispatch) (interceptor.Response, error) {
		w.barrier(agent, barrierReserved, tk)
		firstMu.Lock()
		f := first
		first = false
		firstMu.Unlock()
		status, body, err := w.postGated(ctx, tk, d.Key, holder, f)
		if err != nil {
			return interceptor.Response{}, err
		}
		resp := interceptor.Response{Status: status, Body: body}
		if status == http.StatusAccepted {
			resp.Handle = w.spec.Sink + "/status/" + resultID(body)
		}
		return resp, nil
	}
	ctx = interceptor.WithTask(ctx, w.spec.Task)
	call := interceptor.Call{Operation: operation, Target: w.spec.Intent, Args: w.payload()}
	deadline := w.deadline()
	w.barrier(agent, barrierB0, tk)
	reconciled := 0
	var last error
	for time.Now().Before(deadline) {
		tk.enter()
		res, err := ic.Do(ctx, call, tool)
		tk.leave()
		if err == nil {
			w.barrier(agent, barrierB2, tk)
			return Belief{State: BeliefDone, Result: resultID(res.Output), Reconciled: reconciled}
		}
		last = err
		var v *interceptor.Violation
		switch {
		case errors.As(err, &v) && v.Kind == interceptor.InProgress:
			sleepCtx(ctx, min(v.RetryAfter+20*time.Millisecond, time.Until(deadline)))
		case errors.As(err, &v) && v.Kind == interceptor.PayloadMismatch:
			// The first call stands; its result is the answer.
			w.barrier(agent, barrierB2, tk)
			return Belief{State: BeliefDone, Result: resultID(v.Result), Reconciled: reconciled, Reason: "payload_mismatch: first result stands"}
		case errors.As(err, &v) && v.Kind == interceptor.LeaseLost:
			return Belief{State: BeliefBlocked, Reason: "lease_lost: the key belongs to a successor", Reconciled: reconciled}
		case errors.As(err, &v) && (v.Kind == interceptor.UnknownOutcome || v.Kind == interceptor.AwaitingUpstream) && noProbe:
			// Nothing can settle it automatically: the runtime surfaces it for a person.
			return Belief{State: BeliefBlocked, Reason: string(v.Kind) + ": awaiting reconciliation"}
		case errors.As(err, &v) && (v.Kind == interceptor.UnknownOutcome || v.Kind == interceptor.AwaitingUpstream):
			tk.enter()
			rep, rerr := ic.Reconcile(ctx, interceptor.ReconcileParams{Key: v.Key, By: holder})
			tk.leave()
			if rerr == nil && len(rep.Settled) > 0 {
				reconciled++
				continue
			}
			sleepCtx(ctx, 50*time.Millisecond)
		case errors.Is(err, interceptor.ErrNotDispatched):
			return Belief{State: BeliefBlocked, Reason: "fail closed: " + err.Error(), Reconciled: reconciled}
		case errors.As(err, &v) && v.Kind == interceptor.MarginTooSmall, errors.Is(err, interceptor.ErrCallFailed):
			sleepCtx(ctx, 20*time.Millisecond)
		default:
			return Belief{State: BeliefBlocked, Reason: err.Error(), Reconciled: reconciled}
		}
	}
	return Belief{State: BeliefBlocked, Reason: fmt.Sprintf("gave up: %v", last), Reconciled: reconciled}
}

// probe asks the sink what became of the attempt, looking it up by the Idempotency-Key.
func (w *worker) probe(ctx context.Context, r *residual.Residual) (interceptor.ProbeResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.spec.Sink+"/lookup?key="+url.QueryEscape(r.Key), nil)
	if err != nil {
		return interceptor.ProbeResult{}, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return interceptor.ProbeResult{}, err
	}
	defer resp.Body.Close()
	var ans lookupAnswer
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
		return interceptor.ProbeResult{}, fmt.Errorf("sink lookup: %w", err)
	}
	if len(ans.Effects) > 0 {
		e := ans.Effects[0]
		body, _ := json.Marshal(map[string]string{"status": "done", "effect_id": e.ID, "job": e.Job})
		return interceptor.ProbeResult{Outcome: residual.Succeeded, Result: body, Evidence: "sink has effect " + e.ID}, nil
	}
	for _, j := range ans.Jobs {
		if j.Status == "queued" {
			return interceptor.ProbeResult{Outcome: residual.Accepted, Evidence: "sink job " + j.Job + " still queued"}, nil
		}
	}
	return interceptor.ProbeResult{Outcome: residual.Failed, Evidence: "sink has no effect for the key"}, nil
}

// baselineAgent is the agent runtime over a baseline: it waits out conflicts, retries
// errors a few times (as agent runtimes do), and believes any 2xx answer.
func (w *worker) baselineAgent(ctx context.Context, g baselines.Guard, agent int) Belief {
	holder := fmt.Sprintf("%s/%d/%d", w.spec.Name, os.Getpid(), agent)
	tk := &ticket{gate: w.gate}
	defer tk.leave()
	defer tk.leaveHang()
	if w.spec.Mode == modeHang {
		tk.enterHang(w.hangs)
	}
	first := true
	var firstMu sync.Mutex
	call := func(ctx context.Context, key string) ([]byte, error) {
		w.barrier(agent, barrierReserved, tk)
		firstMu.Lock()
		f := first
		first = false
		firstMu.Unlock()
		status, body, err := w.postGated(ctx, tk, key, holder, f)
		if err != nil {
			return nil, err
		}
		if status/100 != 2 {
			return nil, fmt.Errorf("upstream status %d: %s", status, bytes.TrimSpace(body))
		}
		return body, nil
	}
	req := baselines.Request{Task: w.spec.Task, Operation: operation, Target: w.spec.Intent, Args: w.payload()}
	deadline := w.deadline()
	w.barrier(agent, barrierB0, tk)
	var last error
	for errs := 0; errs < 4 && time.Now().Before(deadline); {
		tk.enter()
		res, err := g.Do(ctx, req, call)
		tk.leave()
		if err == nil {
			w.barrier(agent, barrierB2, tk)
			return Belief{State: BeliefDone, Result: resultID(res)}
		}
		last = err
		var ce *baselines.ConflictError
		if errors.As(err, &ce) {
			sleepCtx(ctx, min(max(ce.RetryAfter, 0)+20*time.Millisecond, time.Until(deadline)))
			continue
		}
		errs++
		sleepCtx(ctx, 30*time.Millisecond)
	}
	return Belief{State: BeliefBlocked, Reason: fmt.Sprintf("gave up: %v", last)}
}
