package demo

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
)

// DefaultLeaseTTL is the lease of the story's charge: short, so the successor does not wait
// long for the dead worker's lease to expire.
const DefaultLeaseTTL = 1500 * time.Millisecond

// WorkerArgs tell a worker process what to charge and where.
type WorkerArgs struct {
	// Store is the badger directory of the ledger.
	Store string
	// Namespace of the keys. Defaults to interceptor.DefaultNamespace.
	Namespace string
	// API is the base URL of the payment API.
	API string
	// Task is the task the charge belongs to; the successor inherits it.
	Task string
	// LeaseTTL is the lease of the charge. Defaults to DefaultLeaseTTL.
	LeaseTTL time.Duration
}

// Flags returns the arguments as command-line flags, as the hidden `toolfence demo-worker`
// command takes them.
func (w WorkerArgs) Flags() []string {
	return []string{
		"--store", w.Store, "--namespace", cmp.Or(w.Namespace, interceptor.DefaultNamespace),
		"--api", w.API, "--task", w.Task, "--lease", cmp.Or(w.LeaseTTL, DefaultLeaseTTL).String(),
	}
}

// RunWorker is the worker process of the story: it opens the ledger in w.Store and runs the
// guarded charge of invoice INV-42 against w.API. The story kills it while the API withholds
// its answer, so normally it never returns. If it does, it writes the outcome to out and
// returns Do's error (nil when the charge was recorded as succeeded).
func RunWorker(ctx context.Context, w WorkerArgs, out io.Writer) error {
	if w.Store == "" || w.API == "" || w.Task == "" {
		return fmt.Errorf("demo worker: store, api and task are required (got %q, %q, %q)", w.Store, w.API, w.Task)
	}
	l, err := badger.Open(w.Store, badger.Options{})
	if err != nil {
		return fmt.Errorf("demo worker: opening the store: %w", err)
	}
	defer l.Close()
	ic, err := interceptor.New(l, interceptor.Config{
		Namespace: w.Namespace,
		Holder:    fmt.Sprintf("demo-worker/pid-%d", os.Getpid()),
		LeaseTTL:  cmp.Or(w.LeaseTTL, DefaultLeaseTTL),
	})
	if err != nil {
		return fmt.Errorf("demo worker: %w", err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	res, err := ic.Do(interceptor.WithTask(ctx, w.Task), ChargeCall(), ChargeTool(&http.Client{Transport: tr}, w.API))
	if err != nil {
		return fmt.Errorf("demo worker: %w", err)
	}
	_, err = fmt.Fprintf(out, "worker: charge recorded as %s (attempt %d, token %d, replayed %t): %s\n",
		res.State, res.Attempt, res.Token, res.Replayed, res.Output)
	return err
}
