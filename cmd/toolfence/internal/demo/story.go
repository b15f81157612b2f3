package demo

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
)

// Options configure Run.
type Options struct {
	// Store is the ledger: a badger directory, or a PostgreSQL DSN (postgres://…). Required.
	// Run opens a badger directory only after the worker is dead, so nothing else may hold
	// it. In a PostgreSQL database Run creates a fresh schema for the run (see Keep).
	Store string
	// Keep keeps the run's PostgreSQL schema; by default Run drops it at the end (a failed
	// drop is part of Run's error). A badger directory is always kept: its caller owns it.
	Keep bool
	// Namespace of the keys. Defaults to interceptor.DefaultNamespace.
	Namespace string
	// Task of the story. Defaults to "demo-" + the UTC time + a random suffix, so runs on
	// one store do not meet each other's residuals.
	Task string
	// LeaseTTL is the lease of the charge. Defaults to DefaultLeaseTTL (1.5s).
	LeaseTTL time.Duration
	// StartWorker returns the (not yet started) worker process: a command that calls
	// RunWorker with w, where w.Store is passed in the environment. Required. Run sets its
	// Stdout and Stderr when nil (to show them if the worker fails), starts it and kills it.
	StartWorker func(ctx context.Context, w WorkerArgs) *exec.Cmd
	// Out receives the timeline, one line per step as it happens. Defaults to io.Discard.
	Out io.Writer
	// Timeout bounds the wait for the worker's charge to reach the API, and then the
	// successor's run. Defaults to 30s.
	Timeout time.Duration
}

// Step is one line of the timeline.
type Step struct {
	// Elapsed is the time since Run started.
	Elapsed time.Duration
	// Name is a short snake_case label: api, worker, charge, sigkill, successor,
	// in_progress, unknown_outcome, reconcile, replay, answer.
	Name   string
	Detail string
}

// String formats the step as a timeline line (without a newline).
func (s Step) String() string {
	return fmt.Sprintf("%6d ms  %-15s  %s", s.Elapsed.Milliseconds(), s.Name, s.Detail)
}

// Report is what Run saw.
type Report struct {
	// Store is the ledger of the run: the badger directory, or the DSN that selects the
	// run's schema (with its password, if the configured DSN had one).
	Store string
	// Schema is the run's PostgreSQL schema; empty on badger.
	Schema          string
	Namespace, Task string
	// Key is the key of the guarded charge (the Idempotency-Key the API saw).
	Key string
	// Charges is how many charges the API made; the story is right when it is 1.
	Charges int
	// Steps is the timeline.
	Steps []Step
	// Replayed is the result the successor's last, replayed charge returned.
	Replayed []byte
	// Answer is the successor agent's final answer.
	Answer string

	start time.Time
	out   io.Writer
	mu    sync.Mutex
}

func (r *Report) step(name, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Step{Elapsed: time.Since(r.start), Name: name, Detail: fmt.Sprintf(format, args...)}
	r.Steps = append(r.Steps, s)
	fmt.Fprintln(r.out, s)
}

// Run plays the story. A worker process runs a langchaingo OpenAIFunctionsAgent whose model
// (scripted, offline) charges invoice INV-42 through the charge tool guarded by toolfence;
// the API records the charge and Run SIGKILLs the worker before the API answers. A
// successor agent in this process, on the same task, asks for the same charge: it meets
// in_progress (the dead worker's lease; the model waits as told) and then unknown_outcome,
// so the model calls toolfence_reconcile, whose probe asks the API by Idempotency-Key and
// settles the residual as succeeded; the model's next charge replays the recorded result
// without reaching the API.
//
// It returns the report, with an error when a step did not go as told or when the API made
// any number of charges but one. The report is non-nil whenever the API was started.
func Run(ctx context.Context, cfg Options) (_ *Report, err error) {
	if cfg.Store == "" || cfg.StartWorker == nil {
		return nil, errors.New("demo: Options.Store and Options.StartWorker are required")
	}
	cfg.Namespace = cmp.Or(cfg.Namespace, interceptor.DefaultNamespace)
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, DefaultLeaseTTL)
	cfg.Timeout = cmp.Or(cfg.Timeout, 30*time.Second)
	if cfg.Task == "" {
		var b [3]byte
		_, _ = rand.Read(b[:])
		cfg.Task = "demo-" + time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
	}
	rep := &Report{
		Store: cfg.Store, Namespace: cfg.Namespace, Task: cfg.Task,
		Key:   residual.Key(cfg.Namespace, cfg.Task, Operation, Target),
		start: time.Now(), out: cmp.Or[io.Writer](cfg.Out, io.Discard),
	}
	if IsDSN(cfg.Store) {
		schema, dsn, err := runSchema(ctx, cfg.Store)
		if err != nil {
			return nil, err
		}
		if !cfg.Keep {
			defer func() { err = errors.Join(err, dropSchema(context.WithoutCancel(ctx), cfg.Store, schema)) }()
		}
		rep.Store, rep.Schema = dsn, schema
	}

	api, err := StartAPI()
	if err != nil {
		return nil, err
	}
	defer api.Close()
	api.HoldNext(1)
	defer func() { rep.Charges = api.Count() }()
	where := "the badger store " + rep.Store
	if rep.Schema != "" {
		where = "the fresh PostgreSQL schema " + rep.Schema
	}
	rep.step("api", "fake payment API on %s (it does not deduplicate: every POST is a new charge); ledger: %s", api.URL, where)

	if err := killWorkerAfterCharge(ctx, cfg, rep.Store, api, rep); err != nil {
		return rep, err
	}
	if err := successor(ctx, cfg, rep.Store, api, rep); err != nil {
		return rep, err
	}
	if n := api.Count(); n != 1 {
		return rep, fmt.Errorf("demo: the API made %d charges of invoice %s, want exactly 1", n, Invoice)
	}
	return rep, nil
}

// killWorkerAfterCharge starts the worker, waits until its charge reaches the API and
// SIGKILLs it before the API answers.
func killWorkerAfterCharge(ctx context.Context, cfg Options, store string, api *PaymentAPI, rep *Report) error {
	w := WorkerArgs{Store: store, Namespace: cfg.Namespace, API: api.URL, Task: cfg.Task, LeaseTTL: cfg.LeaseTTL}
	cmd := cfg.StartWorker(ctx, w)
	var output bytes.Buffer
	if cmd.Stdout == nil {
		cmd.Stdout = &output
	}
	if cmd.Stderr == nil {
		cmd.Stderr = &output
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("demo: starting the worker: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	pid := cmd.Process.Pid
	rep.step("worker", "worker process pid %d runs task %s: a langchaingo OpenAIFunctionsAgent (scripted offline model) whose %s tool is guarded by toolfence, lease %v",
		pid, cfg.Task, Operation, cfg.LeaseTTL)

	timeout := time.NewTimer(cfg.Timeout)
	defer timeout.Stop()
	var c Charge
	select {
	case c = <-api.Arrivals():
	case err := <-exited:
		return fmt.Errorf("demo: the worker exited (%v) before its charge reached the API: %s", err, strings.TrimSpace(output.String()))
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-exited
		return ctx.Err()
	case <-timeout.C:
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("demo: the worker's charge did not reach the API within %v: %s", cfg.Timeout, strings.TrimSpace(output.String()))
	}
	rep.step("charge", "the worker's agent called %s: the API made charge %s of %s under Idempotency-Key %s and withholds its answer",
		Operation, c.ID, c.Invoice, c.IdempotencyKey)
	if c.IdempotencyKey != rep.Key {
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("demo: the API saw Idempotency-Key %q, want the residual's key %s", c.IdempotencyKey, rep.Key)
	}

	if err := cmd.Process.Kill(); err != nil { // SIGKILL on Unix
		return fmt.Errorf("demo: killing the worker: %w", err)
	}
	werr := <-exited
	rep.step("sigkill", "SIGKILL worker pid %d (%v) before the API answered: the charge happened, its outcome was never committed", pid, werr)
	return nil
}
