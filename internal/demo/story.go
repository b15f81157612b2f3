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
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

// Config configures Run.
type Config struct {
	// Store is the badger directory of the ledger. Required. Run opens it only after the
	// worker is dead, so nothing else may hold it.
	Store string
	// Namespace of the keys. Defaults to interceptor.DefaultNamespace.
	Namespace string
	// Task of the story. Defaults to "demo-" + the UTC time + a random suffix, so runs on
	// one store do not meet each other's residuals.
	Task string
	// LeaseTTL is the lease of the charge. Defaults to DefaultLeaseTTL (1.5s).
	LeaseTTL time.Duration
	// StartWorker returns the (not yet started) worker process: a command that calls
	// RunWorker with w. Required. Run sets its Stderr when nil, starts it and kills it.
	StartWorker func(ctx context.Context, w WorkerArgs) *exec.Cmd
	// Out receives the timeline, one line per step as it happens. Defaults to io.Discard.
	Out io.Writer
	// Timeout bounds the wait for the worker's charge to reach the API. Defaults to 30s.
	Timeout time.Duration
}

// Step is one line of the timeline.
type Step struct {
	// Elapsed is the time since Run started.
	Elapsed time.Duration
	// Name is a short snake_case label: api, worker, charge, sigkill, in_progress,
	// unknown_outcome, reconcile, replay.
	Name   string
	Detail string
}

// String formats the step as a timeline line (without a newline).
func (s Step) String() string {
	return fmt.Sprintf("%6d ms  %-15s  %s", s.Elapsed.Milliseconds(), s.Name, s.Detail)
}

// Report is what Run saw.
type Report struct {
	Store, Namespace, Task string
	// Key is the key of the guarded charge (the Idempotency-Key the API saw).
	Key string
	// Charges is how many charges the API made; the story is right when it is 1.
	Charges int
	// Steps is the timeline.
	Steps []Step
	// Replayed is the result the last, replayed call returned.
	Replayed []byte

	start time.Time
	out   io.Writer
}

func (r *Report) step(name, format string, args ...any) {
	s := Step{Elapsed: time.Since(r.start), Name: name, Detail: fmt.Sprintf(format, args...)}
	r.Steps = append(r.Steps, s)
	fmt.Fprintln(r.out, s)
}

// Run plays the story: a worker process charges invoice INV-42 through the interceptor; the
// API records the charge and Run SIGKILLs the worker before the API answers; a successor in
// this process meets InProgress (the dead worker's lease), then UnknownOutcome once the lease
// expires, reconciles through the charge probe (the residual resolves to succeeded) and
// retries, which replays the recorded result without reaching the API.
//
// It returns the report, with an error when a step did not go as told or when the API made
// any number of charges but one. The report is non-nil whenever the API was started.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Store == "" || cfg.StartWorker == nil {
		return nil, errors.New("demo: Config.Store and Config.StartWorker are required")
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

	api, err := StartAPI()
	if err != nil {
		return nil, err
	}
	defer api.Close()
	api.HoldNext(1)
	defer func() { rep.Charges = api.Count() }()
	rep.step("api", "fake payment API on %s (it does not deduplicate: every POST is a new charge)", api.URL)

	if err := killWorkerAfterCharge(ctx, cfg, api, rep); err != nil {
		return rep, err
	}
	if err := successor(ctx, cfg, api, rep); err != nil {
		return rep, err
	}
	if n := api.Count(); n != 1 {
		return rep, fmt.Errorf("demo: the API made %d charges of invoice %s, want exactly 1", n, Invoice)
	}
	return rep, nil
}

// killWorkerAfterCharge starts the worker, waits until its charge reaches the API and
// SIGKILLs it before the API answers.
func killWorkerAfterCharge(ctx context.Context, cfg Config, api *PaymentAPI, rep *Report) error {
	w := WorkerArgs{Store: cfg.Store, Namespace: cfg.Namespace, API: api.URL, Task: cfg.Task, LeaseTTL: cfg.LeaseTTL}
	cmd := cfg.StartWorker(ctx, w)
	var stderr bytes.Buffer
	if cmd.Stderr == nil {
		cmd.Stderr = &stderr
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("demo: starting the worker: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	pid := cmd.Process.Pid
	rep.step("worker", "worker process pid %d runs task %s: guarded %s of %s, lease %v", pid, cfg.Task, Operation, Target, cfg.LeaseTTL)

	timeout := time.NewTimer(cfg.Timeout)
	defer timeout.Stop()
	var c Charge
	select {
	case c = <-api.Arrivals():
	case err := <-exited:
		return fmt.Errorf("demo: the worker exited (%v) before its charge reached the API: %s", err, strings.TrimSpace(stderr.String()))
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-exited
		return ctx.Err()
	case <-timeout.C:
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("demo: the worker's charge did not reach the API within %v: %s", cfg.Timeout, strings.TrimSpace(stderr.String()))
	}
	rep.step("charge", "the API made charge %s of %s under Idempotency-Key %s and withholds its answer", c.ID, c.Invoice, c.IdempotencyKey)
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

// successor plays the successor run in this process, on the ledger the dead worker left.
func successor(ctx context.Context, cfg Config, api *PaymentAPI, rep *Report) error {
	l, err := badger.Open(cfg.Store, badger.Options{})
	if err != nil {
		return fmt.Errorf("demo: opening the store after the kill: %w", err)
	}
	defer l.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	ic, err := interceptor.New(l, interceptor.Config{
		Namespace: cfg.Namespace,
		Holder:    fmt.Sprintf("demo-successor/pid-%d", os.Getpid()),
		LeaseTTL:  cfg.LeaseTTL,
		Operations: map[string]interceptor.Operation{
			Operation: {Probe: ChargeProbe(client, api.URL)},
		},
	})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	tctx := interceptor.WithTask(ctx, cfg.Task)
	tool := ChargeTool(client, api.URL)

	// Retry the charge until the dead worker's lease expires and it reads as unknown.
	for i := 0; ; i++ {
		res, err := ic.Do(tctx, ChargeCall(), tool)
		var v *interceptor.Violation
		if !errors.As(err, &v) {
			return fmt.Errorf("demo: the successor's charge should have been refused, got result %+v, error %v", res, err)
		}
		if v.Kind == interceptor.UnknownOutcome {
			rep.step("unknown_outcome", "successor: charge refused: attempt %d by %s may have reached the API and nobody recorded the outcome; reconcile first", v.Attempt, v.Holder)
			break
		}
		if v.Kind != interceptor.InProgress || i >= 20 {
			return fmt.Errorf("demo: the successor's charge: %w", err)
		}
		wait := v.RetryAfter + 20*time.Millisecond
		rep.step("in_progress", "successor: charge refused: attempt %d by %s holds a live lease (token %d); retry after %d ms",
			v.Attempt, v.Holder, v.Token, v.RetryAfter.Milliseconds())
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	rr, err := ic.Reconcile(ctx, interceptor.ReconcileParams{Key: rep.Key, By: fmt.Sprintf("demo-successor/pid-%d", os.Getpid())})
	if err != nil {
		return fmt.Errorf("demo: reconcile: %w", err)
	}
	if len(rr.Resolved) != 1 {
		return fmt.Errorf("demo: reconcile left the charge open: %+v", rr.Open)
	}
	s := rr.Resolved[0]
	rep.step("reconcile", "probe asked the API by Idempotency-Key (%s); residual %s → %s under fencing token %d", s.Evidence, s.From, s.To, s.Token)

	before := api.Count()
	res, err := ic.Do(tctx, ChargeCall(), tool)
	if err != nil {
		return fmt.Errorf("demo: the retry after reconciliation: %w", err)
	}
	if !res.Replayed || api.Count() != before {
		return fmt.Errorf("demo: the retry after reconciliation reached the API (replayed %t, charges %d → %d)", res.Replayed, before, api.Count())
	}
	rep.Replayed = res.Output
	rep.step("replay", "successor: charge replayed the recorded result, the API was not called: %s", res.Output)
	return nil
}
