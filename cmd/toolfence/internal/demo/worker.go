package demo

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	lctools "github.com/tmc/langchaingo/tools"

	"github.com/toolfence/toolfence/examples/scripted"
	"github.com/toolfence/toolfence/interceptor"
)

// DefaultLeaseTTL is the lease of the story's charge: short, so the successor does not wait
// long for the dead worker's lease to expire.
const DefaultLeaseTTL = 1500 * time.Millisecond

// WorkerArgs tell a worker process what to charge and where.
type WorkerArgs struct {
	// Store is the ledger: a badger directory or a PostgreSQL DSN. It is not among Flags:
	// pass it in the environment, so a DSN's password stays off the command line.
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

// Flags returns the arguments but Store as command-line flags, as the hidden
// `toolfence demo-worker` command takes them.
func (w WorkerArgs) Flags() []string {
	return []string{
		"--namespace", cmp.Or(w.Namespace, interceptor.DefaultNamespace),
		"--api", w.API, "--task", w.Task, "--lease", cmp.Or(w.LeaseTTL, DefaultLeaseTTL).String(),
	}
}

// RunWorker is the worker process of the story: it opens the ledger in w.Store and runs a
// langchaingo OpenAIFunctionsAgent, with the scripted offline model, whose one tool is the
// charge guarded by toolfence; the model charges invoice INV-42 against w.API. The story
// kills it while the API withholds its answer, so normally it never returns. If it does, it
// writes the agent's answer to out and returns the agent's error (nil when the agent
// finished).
func RunWorker(ctx context.Context, w WorkerArgs, out io.Writer) error {
	if w.Store == "" || w.API == "" || w.Task == "" {
		return fmt.Errorf("demo worker: store, api and task are required (got store set %t, api %q, task %q)", w.Store != "", w.API, w.Task)
	}
	l, err := openLedger(ctx, w.Store)
	if err != nil {
		return fmt.Errorf("demo worker: opening the store: %w", err)
	}
	defer l.Close()
	ic, err := interceptor.New(l, interceptor.Options{
		Namespace: w.Namespace,
		Holder:    fmt.Sprintf("demo-worker/pid-%d", os.Getpid()),
		LeaseTTL:  cmp.Or(w.LeaseTTL, DefaultLeaseTTL),
	})
	if err != nil {
		return fmt.Errorf("demo worker: %w", err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	printf := func(format string, args ...any) { fmt.Fprintf(out, format, args...) }
	model := workerScript(printf)
	charge := GuardedCharge(ic, tr, w.API)
	answer, err := scripted.Run(interceptor.WithTask(ctx, w.Task), model, []lctools.Tool{charge}, Input)
	if err != nil {
		return fmt.Errorf("demo worker: the agent: %w", err)
	}
	_, err = fmt.Fprintf(out, "worker: the agent finished: %s\n", answer)
	return err
}
