package jepsen

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolfence/toolfence/evals/faultproxy"
	"github.com/toolfence/toolfence/internal/fixture/pgcluster"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/ledger/postgres"
)

// Fault kinds the nemesis knows.
const (
	FKill      = "kill"      // SIGKILL a worker process; a new one takes its place
	FStop      = "stop"      // SIGSTOP a worker process, SIGCONT it after the fault's time
	FTerminate = "terminate" // pg_terminate_backend of every backend of the workers
	FLatency   = "latency"   // 40 ms each way through the proxy
	FBandwidth = "bandwidth" // 16 KiB/s per connection direction through the proxy
	FReset     = "reset"     // TCP reset of every proxied connection
	FTimeout   = "timeout"   // the proxy forwards nothing (connections hang), then resumes
	FPartition = "partition" // every connection cut silently, new ones hang; heal closes them
	FSkew      = "skew"      // client clocks jump (badger: the ledger's clock jumps forward)
	FRestart   = "restart"   // PostgreSQL crash (immediate stop) and restart
	FFailover  = "failover"  // primary crash with its standby held behind, standby promoted
)

// PostgresFaults and BadgerFaults are every fault kind each backend runs, in schedule order.
var (
	PostgresFaults = []string{FKill, FTerminate, FLatency, FReset, FStop, FTimeout, FSkew, FPartition, FBandwidth, FRestart, FFailover}
	BadgerFaults   = []string{FKill, FSkew, FStop}
)

// Options sets up a run. Zero fields take the defaults named.
type Options struct {
	// Backend is "badger" or "postgres".
	Backend string
	// Duration of the workload. Defaults to 30 s.
	Duration time.Duration
	// Workers is the number of worker processes at a time (PostgreSQL). Defaults to 3;
	// badger allows one process at a time (its directory lock), so it runs 1.
	Workers int
	// Clients per worker process. Defaults to 3.
	Clients int
	// Slots and Epoch shape the keys (see Workload). Default 3 and 5 s.
	Slots int
	Epoch time.Duration
	// Faults is the schedule: the nemesis injects them in this order, round robin.
	// Defaults to PostgresFaults or BadgerFaults.
	Faults []string
	// FaultFor is how long a fault lasts; Quiet the healthy time between faults. Default
	// 1.5 s and 1 s.
	FaultFor, Quiet time.Duration
	// Dir receives history.jsonl, verdict.json, faults.json and, on a violation,
	// violation.html. Required.
	Dir string
	// Exe and Args start a worker process; the harness adds WorkerEnv. Exe defaults to
	// this executable.
	Exe  string
	Args []string
	// Seed makes the workload's choices repeatable. Defaults to the time.
	Seed uint64
	// CheckTimeout bounds the linearizability check. Defaults to 5 min.
	CheckTimeout time.Duration
	// Log receives progress lines. Defaults to io.Discard.
	Log io.Writer
	// AsyncStandby makes the standby of the failover fault asynchronous (and the
	// workers open with postgres.Options.AllowAsyncReplicas): a failover then loses the
	// writes the standby had not received, which the checks must catch. Defaults to false:
	// the standby is synchronous (synchronous_standby_names = '*').
	AsyncStandby bool
}

func (c *Options) defaults() error {
	switch c.Backend {
	case "postgres":
		c.Workers = cmp.Or(c.Workers, 3)
		if c.Faults == nil {
			c.Faults = PostgresFaults
		}
	case "badger":
		c.Workers = 1
		if c.Faults == nil {
			c.Faults = BadgerFaults
		}
	default:
		return fmt.Errorf("jepsen: backend %q: want badger or postgres", c.Backend)
	}
	for _, f := range c.Faults {
		if !validFault(c.Backend, f) {
			return fmt.Errorf("jepsen: fault %q does not apply to %s (want one of %v)", f, c.Backend, map[string][]string{"postgres": PostgresFaults, "badger": append(BadgerFaults, FPower)}[c.Backend])
		}
	}
	if c.Dir == "" {
		return errors.New("jepsen: a report directory is required")
	}
	c.Duration = cmp.Or(c.Duration, 30*time.Second)
	c.Clients = cmp.Or(c.Clients, 3)
	c.Slots = cmp.Or(c.Slots, 3)
	c.Epoch = cmp.Or(c.Epoch, 5*time.Second)
	c.FaultFor = cmp.Or(c.FaultFor, 1500*time.Millisecond)
	c.Quiet = cmp.Or(c.Quiet, time.Second)
	c.CheckTimeout = cmp.Or(c.CheckTimeout, 5*time.Minute)
	c.Seed = cmp.Or(c.Seed, uint64(time.Now().UnixNano()))
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		c.Exe = exe
	}
	return nil
}

func validFault(backend, f string) bool {
	list := PostgresFaults
	if backend == "badger" {
		list = append(BadgerFaults, FPower) // FPower is opt-in: it needs FUSE (power.go)
	}
	for _, x := range list {
		if x == f {
			return true
		}
	}
	return false
}

// FaultRecord is one injected fault.
type FaultRecord struct {
	Kind   string    `json:"kind"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	Detail string    `json:"detail,omitempty"`
}

// Report is the outcome of a run.
type Report struct {
	Backend  string         `json:"backend"`
	Seed     uint64         `json:"seed"`
	Duration string         `json:"duration"`
	Elapsed  string         `json:"elapsed"`
	Workers  int            `json:"workers"`
	Procs    int            `json:"processes"` // worker processes started in all
	Clients  int            `json:"clients"`   // clients in all, across processes
	Faults   []FaultRecord  `json:"faults"`
	Injected map[string]int `json:"injected"`
	Verdict  *Verdict       `json:"verdict"`
	Power    *PowerReport   `json:"power,omitempty"` // runs with FPower only
	Dir      string         `json:"dir"`
}

// worker is one running worker process.
type worker struct {
	slot, proc int
	cmd        *exec.Cmd
	stdin      io.WriteCloser
	done       chan struct{}
	mu         sync.Mutex
}

func (w *worker) send(line string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = io.WriteString(w.stdin, line+"\n")
}

// harness is the state of a run.
type harness struct {
	cfg     Options
	h       *History
	start   time.Time
	proxy   *faultproxy.Proxy
	cluster *pgcluster.Cluster
	store   string // badger dir or the proxied DSN
	admin   *pgx.Conn
	power   *power // the lazy FS under the badger store, with FPower
	// standby streams from cluster through repl (failover fault only).
	standby *pgcluster.Cluster
	repl    *faultproxy.Proxy

	mu      sync.Mutex
	workers []*worker
	procs   int
	offset  time.Duration // badger's ledger clock offset: only moves forward
	faults  []FaultRecord
	stderr  *os.File
	rng     *rand.Rand
	wg      sync.WaitGroup
}

// Run runs the workload under the nemesis, checks the history and writes the report into
// cfg.Dir. It returns an error when the run could not be set up; a history that fails its
// checks is reported in Report.Verdict, not as an error.
func Run(ctx context.Context, cfg Options) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	hs := &harness{cfg: cfg, h: newHistory(), rng: rand.New(rand.NewPCG(cfg.Seed, 7))}
	var err error
	if hs.stderr, err = os.Create(filepath.Join(cfg.Dir, "workers.log")); err != nil {
		return nil, err
	}
	defer hs.stderr.Close()
	if err := hs.setup(ctx); err != nil {
		hs.teardown()
		return nil, err
	}
	defer hs.teardown()
	hs.start = time.Now()
	w := hs.workload()
	for i := range cfg.Workers {
		if err := hs.spawn(i); err != nil {
			hs.stopAll()
			return nil, err
		}
	}
	fmt.Fprintf(cfg.Log, "jepsen %s: %d workers × %d clients, %v, faults %v, seed %d, report in %s\n",
		cfg.Backend, cfg.Workers, cfg.Clients, cfg.Duration, cfg.Faults, cfg.Seed, cfg.Dir)
	nctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	hs.nemesis(nctx)
	cancel()
	hs.heal()
	hs.stopAll()
	if err := hs.finalPowerCut(); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Log, "jepsen %s: workload done after %v; final reads\n", cfg.Backend, time.Since(hs.start).Round(time.Millisecond))
	if err := hs.finalReads(ctx, w); err != nil && !hs.powerLost(err) {
		return nil, err
	}
	ops := hs.h.Ops()
	if err := WriteHistory(filepath.Join(cfg.Dir, "history.jsonl"), ops); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Log, "jepsen %s: checking %d ops\n", cfg.Backend, len(ops))
	v := Check(ops, cfg.CheckTimeout, cfg.Dir)
	v.Violations = append(v.Violations, hs.powerViolations()...)
	rep := &Report{Backend: cfg.Backend, Seed: cfg.Seed, Duration: cfg.Duration.String(),
		Elapsed: time.Since(hs.start).Round(time.Millisecond).String(), Workers: cfg.Workers,
		Procs: hs.procs, Clients: hs.procs * cfg.Clients, Faults: hs.faults, Injected: map[string]int{}, Verdict: v, Power: hs.powerReport(), Dir: cfg.Dir}
	for _, f := range hs.faults {
		rep.Injected[f.Kind]++
	}
	if err := WriteVerdict(cfg.Dir, v); err != nil {
		return nil, err
	}
	b, _ := jsonIndent(rep)
	if err := os.WriteFile(filepath.Join(cfg.Dir, "report.json"), b, 0o644); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Log, "jepsen %s: %s (check %s)\n", cfg.Backend, v, v.CheckTime)
	return rep, nil
}

func (hs *harness) workload() Workload {
	return Workload{Start: hs.start, Epoch: hs.cfg.Epoch, Slots: hs.cfg.Slots, GC: true}
}

func (hs *harness) setup(ctx context.Context) error {
	switch hs.cfg.Backend {
	case "badger":
		if hs.hasPower() {
			return hs.setupPower()
		}
		hs.store = filepath.Join(hs.cfg.Dir, "store")
		return os.RemoveAll(hs.store)
	}
	fmt.Fprintf(hs.cfg.Log, "jepsen postgres: starting a throwaway cluster (initdb)\n")
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		return err
	}
	hs.cluster = c
	if hs.proxy, err = faultproxy.Start("127.0.0.1:0", c.Addr()); err != nil {
		return err
	}
	hs.store = c.DSN(hs.proxy.Addr(), "")
	// Migrate once, directly, before any fault.
	l, err := postgres.Open(ctx, c.DSN("", ""), postgres.Options{Schema: namespace})
	if err != nil {
		return err
	}
	_ = l.Close()
	if slices.Contains(hs.cfg.Faults, FFailover) {
		return hs.startStandby(ctx)
	}
	return nil
}

// startStandby gives the primary a standby that streams through the proxy hs.repl (so the
// failover can hold it behind). Unless AsyncStandby, the primary first requires a
// synchronous standby; pg_basebackup copies that setting, so a promoted standby requires
// one too, and its commits wait until the next standby streams.
func (hs *harness) startStandby(ctx context.Context) error {
	if !hs.cfg.AsyncStandby {
		if err := hs.adminExec(ctx, `ALTER SYSTEM SET synchronous_standby_names = '*'`, `SELECT pg_reload_conf()`); err != nil {
			return err
		}
	}
	var err error
	if hs.repl == nil {
		if hs.repl, err = faultproxy.Start("127.0.0.1:0", hs.cluster.Addr()); err != nil {
			return err
		}
	}
	s, err := hs.cluster.Standby(ctx, hs.repl.Addr(), "jepsen-standby", pgcluster.Options{Settings: []string{"wal_retrieve_retry_interval=100ms"}})
	if err != nil {
		return err
	}
	hs.standby = s
	want := "sync"
	if hs.cfg.AsyncStandby {
		want = "async"
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		err := hs.adminQuery(ctx, `SELECT count(*) FROM pg_stat_replication WHERE application_name = 'jepsen-standby' AND state = 'streaming' AND sync_state = $1`, []any{want}, &n)
		if err == nil && n > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("jepsen: the standby did not stream as %s within a minute (%v): %s", want, err, s.LogTail(2000))
		}
		sleep(ctx, 50*time.Millisecond) // the server's view changes without an event to wait on
	}
}

// failover crashes the primary while its standby is held d/2 behind (replication
// forwards nothing), promotes the standby, points the clients' proxy at it and gives it a
// new standby. A synchronous standby has every acknowledged write (the primary's commits
// waited); an asynchronous one lacks what the primary acknowledged meanwhile.
func (hs *harness) failover(d time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	old, next := hs.cluster, hs.standby
	hs.repl.SetMode(faultproxy.Blackhole)
	sleep(ctx, d/2)
	old.Stop()
	if err := next.Ctl(ctx, "promote"); err != nil {
		return "", err
	}
	hs.cluster, hs.standby = next, nil
	hs.proxy.SetTarget(next.Addr())
	hs.proxy.Reset()
	hs.repl.SetTarget(next.Addr())
	hs.repl.Reset()
	hs.repl.Heal()
	start := time.Now()
	if err := hs.startStandby(ctx); err != nil {
		return "", err
	}
	mode := "synchronous"
	if hs.cfg.AsyncStandby {
		mode = "asynchronous"
	}
	return fmt.Sprintf("primary crashed with its %s standby held %v behind; standby promoted; new standby streaming after %v",
		mode, d/2, time.Since(start).Round(time.Millisecond)), nil
}

func (hs *harness) teardown() {
	hs.teardownPower()
	if hs.admin != nil {
		_ = hs.admin.Close(context.Background())
	}
	if hs.proxy != nil {
		_ = hs.proxy.Close()
	}
	if hs.repl != nil {
		_ = hs.repl.Close()
	}
	if hs.standby != nil {
		hs.standby.Stop()
	}
	if hs.cluster != nil {
		hs.cluster.Stop()
	}
}

// spawn starts a worker process in slot i.
func (hs *harness) spawn(i int) error {
	hs.mu.Lock()
	proc := hs.procs
	hs.procs++
	off := hs.offset
	hs.mu.Unlock()
	store := hs.store
	if hs.cfg.Backend == "postgres" {
		store += fmt.Sprintf("&application_name=jepsen-w%d", proc)
	}
	wc := workerConfig{Backend: hs.cfg.Backend, Store: store, Schema: namespace, Proc: proc, Clients: hs.cfg.Clients,
		ClientBase: proc * hs.cfg.Clients, Workload: hs.workload(), Offset: off, Seed: hs.cfg.Seed + uint64(proc),
		WriteTimeout: 3 * time.Second, AllowAsync: hs.cfg.AsyncStandby}
	b, err := json.Marshal(wc)
	if err != nil {
		return err
	}
	cmd := exec.Command(hs.cfg.Exe, hs.cfg.Args...)
	cmd.Env = append(os.Environ(), WorkerEnv+"="+string(b))
	cmd.Stderr = hs.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("jepsen: start worker %s: %w", hs.cfg.Exe, err)
	}
	w := &worker{slot: i, proc: proc, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	hs.wg.Add(1)
	go func() {
		defer hs.wg.Done()
		hs.h.read(stdout)
		_ = cmd.Wait()
		close(w.done)
	}()
	hs.mu.Lock()
	if i < len(hs.workers) {
		hs.workers[i] = w
	} else {
		hs.workers = append(hs.workers, w)
	}
	hs.mu.Unlock()
	return nil
}

func (hs *harness) worker(i int) *worker {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.workers[i%len(hs.workers)]
}

// stopAll asks every worker to stop and waits; one that does not stop in time is killed.
func (hs *harness) stopAll() {
	hs.mu.Lock()
	ws := append([]*worker(nil), hs.workers...)
	hs.mu.Unlock()
	for _, w := range ws {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		w.send("stop")
	}
	for _, w := range ws {
		select {
		case <-w.done:
		case <-time.After(60 * time.Second):
			_ = w.cmd.Process.Kill()
			<-w.done
		}
	}
	hs.wg.Wait()
}

// record notes a fault.
func (hs *harness) record(kind string, start time.Time, detail string) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.faults = append(hs.faults, FaultRecord{Kind: kind, Start: start, End: time.Now(), Detail: detail})
	fmt.Fprintf(hs.cfg.Log, "  %6.1fs %-9s %s\n", time.Since(hs.start).Seconds(), kind, detail)
}

// nemesis injects the scheduled faults round robin until ctx ends: quiet, fault, heal.
func (hs *harness) nemesis(ctx context.Context) {
	for n := 0; ; n++ {
		sleep(ctx, hs.cfg.Quiet)
		if ctx.Err() != nil {
			return
		}
		kind := hs.cfg.Faults[n%len(hs.cfg.Faults)]
		start := time.Now()
		detail, err := hs.inject(ctx, kind, n)
		if err != nil {
			detail = "FAILED: " + err.Error()
		}
		hs.record(kind, start, detail)
	}
}

// inject runs one fault to its end (heal included).
func (hs *harness) inject(ctx context.Context, kind string, n int) (string, error) {
	d := hs.cfg.FaultFor
	switch kind {
	case FKill:
		w := hs.worker(n)
		if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			return "", err
		}
		<-w.done
		sleep(ctx, d/3)
		if err := hs.spawn(w.slot); err != nil {
			return "", err
		}
		return fmt.Sprintf("SIGKILL worker process %d (pid %d); process %d replaces it", w.proc, w.cmd.Process.Pid, hs.procs-1), nil
	case FStop:
		w := hs.worker(n)
		if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return "", err
		}
		sleep(context.Background(), d)
		if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			return "", err
		}
		return fmt.Sprintf("SIGSTOP worker process %d (pid %d) for %v", w.proc, w.cmd.Process.Pid, d), nil
	case FTerminate:
		n, err := hs.terminateBackends(ctx)
		return fmt.Sprintf("pg_terminate_backend of %d worker backends", n), err
	case FLatency:
		hs.proxy.SetLatency(40 * time.Millisecond)
		sleep(context.Background(), d)
		hs.proxy.SetLatency(0)
		return fmt.Sprintf("40ms each way for %v", d), nil
	case FBandwidth:
		hs.proxy.SetBandwidth(16 << 10)
		sleep(context.Background(), d)
		hs.proxy.SetBandwidth(0)
		return fmt.Sprintf("16 KiB/s per direction for %v", d), nil
	case FReset:
		return fmt.Sprintf("reset %d connections", hs.proxy.Reset()), nil
	case FTimeout:
		hs.proxy.SetMode(faultproxy.Blackhole)
		sleep(context.Background(), d)
		hs.proxy.SetMode(faultproxy.Pass)
		return fmt.Sprintf("forwarded nothing for %v (%d connections held)", d, hs.proxy.Conns()), nil
	case FPartition:
		hs.proxy.Partition()
		sleep(context.Background(), d)
		hs.proxy.Heal()
		return fmt.Sprintf("full partition for %v, healed", d), nil
	case FSkew:
		return hs.skew(), nil
	case FPower:
		return hs.powerCut(ctx, n)
	case FRestart:
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := hs.cluster.Ctl(rctx, "restart"); err != nil {
			return "", err
		}
		return "pg_ctl restart -m immediate (crash and recovery)", nil
	case FFailover:
		return hs.failover(d)
	}
	return "", fmt.Errorf("unknown fault %q", kind)
}

// skew moves the workers' clocks. For PostgreSQL every worker gets its own offset of up to
// ±30 s (the server's clock must decide, whatever the clients believe); for badger the
// ledger's own clock jumps forward 2-10 s (it is never set back: see docs/reliability.md).
func (hs *harness) skew() string {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.cfg.Backend == "badger" {
		hs.offset += time.Duration(2+hs.rng.IntN(9)) * time.Second
		for _, w := range hs.workers {
			w.send(fmt.Sprintf("skew %d", int64(hs.offset)))
		}
		return fmt.Sprintf("ledger clock jumps forward to +%v", hs.offset)
	}
	detail := ""
	for _, w := range hs.workers {
		off := time.Duration(hs.rng.IntN(60_000)-30_000) * time.Millisecond
		w.send(fmt.Sprintf("skew %d", int64(off)))
		detail += fmt.Sprintf("process %d %+v; ", w.proc, off)
	}
	return detail
}

func (hs *harness) terminateBackends(ctx context.Context) (int, error) {
	var n int
	err := hs.adminQuery(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE 'jepsen-w%'`, nil, &n)
	return n, err
}

// adminQuery runs one query on the harness's own connection to the current primary,
// reconnecting once when the connection died (a server restart, a failover).
func (hs *harness) adminQuery(ctx context.Context, sql string, args []any, dest ...any) error {
	return hs.withAdmin(ctx, func(c *pgx.Conn) error { return c.QueryRow(ctx, sql, args...).Scan(dest...) })
}

// adminExec runs statements on the harness's connection to the current primary.
func (hs *harness) adminExec(ctx context.Context, stmts ...string) error {
	for _, s := range stmts {
		if err := hs.withAdmin(ctx, func(c *pgx.Conn) error { _, err := c.Exec(ctx, s); return err }); err != nil {
			return fmt.Errorf("jepsen: %s: %w", s, err)
		}
	}
	return nil
}

func (hs *harness) withAdmin(ctx context.Context, fn func(*pgx.Conn) error) error {
	var err error
	for range 2 {
		if hs.admin != nil && (hs.admin.IsClosed() || hs.admin.Config().Port != uint16(hs.cluster.Port)) {
			_ = hs.admin.Close(ctx)
			hs.admin = nil
		}
		if hs.admin == nil {
			if hs.admin, err = pgx.Connect(ctx, hs.cluster.DSN("", "")); err != nil {
				hs.admin = nil
				continue
			}
		}
		if err = fn(hs.admin); err == nil {
			return nil
		}
		_ = hs.admin.Close(ctx)
		hs.admin = nil
	}
	return err
}

// heal ends every fault: the network passes, stopped workers continue.
func (hs *harness) heal() {
	if hs.proxy != nil {
		hs.proxy.Heal()
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	for _, w := range hs.workers {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// finalReads reads every key the run may have used, through a fresh ledger (reopened
// after the last process kill or server restart), into the history.
func (hs *harness) finalReads(ctx context.Context, w Workload) error {
	var l ledger.Ledger
	var err error
	clock := &SkewClock{}
	clock.Set(hs.offset)
	switch hs.cfg.Backend {
	case "badger":
		l, err = badger.Open(hs.store, badger.Options{Clock: clock})
	default:
		l, err = postgres.Open(ctx, hs.cluster.DSN("", ""), postgres.Options{Schema: namespace, AllowAsyncReplicas: hs.cfg.AsyncStandby})
	}
	if err != nil {
		return fmt.Errorf("jepsen: reopen the store for the final reads: %w", err)
	}
	defer l.Close()
	off := func() time.Duration { return 0 }
	if hs.cfg.Backend == "badger" {
		off = clock.Offset
	}
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		hs.h.read(pr)
		close(done)
	}()
	var seq = new(atomicSeq)
	c := &client{id: hs.procs * hs.cfg.Clients, proc: hs.procs, l: l, rec: &recorder{w: pw}, w: w, clock: clock,
		ledgerOffset: off, seq: seq.p(int64(hs.procs) << 32)}
	for _, slot := range w.AllSlots(time.Since(hs.start)) {
		c.get(slot)
	}
	_ = pw.Close()
	<-done
	return nil
}
