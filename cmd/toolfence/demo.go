package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/cmd/toolfence/internal/demo"
	"github.com/toolfence/toolfence/interceptor"
)

func newDemoCmd(a *app) *cobra.Command {
	var rm, keep bool
	cmd := &cobra.Command{
		Use:   "demo [--store DIR|postgres://…] [--rm]",
		Short: "Run the crash-and-hand-over story: one charge, however the agent dies",
		Long: `Run a self-contained story with two langchaingo agents and print its timeline:

  1. a local fake payment API starts; it does not deduplicate, so every POST is a charge;
  2. a worker process runs a langchaingo OpenAIFunctionsAgent whose model (scripted,
     offline) charges invoice INV-42 through a tool guarded by toolfence (the key goes
     upstream as Idempotency-Key);
  3. the API makes the charge and the worker is killed with SIGKILL before the API
     answers: the charge happened, its outcome was never committed;
  4. a successor agent takes over the same task and asks for the same charge: first the
     dead worker's lease is still live (in_progress: the agent is told when to retry and
     waits), then the charge reads as unknown_outcome: the agent is told to reconcile;
  5. the agent calls toolfence_reconcile: the charge's probe asks the API by
     Idempotency-Key, and the residual resolves to succeeded;
  6. the agent's next charge replays the recorded result without reaching the API.

It ends with "charges at the API: 1" and exits with status 1 if the count is anything else.

The store is a fresh temporary directory (not ./.toolfence, where ls looks by default): the
demo keeps it and prints where it is and the exact ls and show commands that look at it.
--rm removes it afterwards instead. --store DIR runs the story in that directory (a new or
empty one, or a toolfence store) and keeps it. With --store postgres://… the story runs in
a fresh schema of that database, kept (with the commands to look at it) unless --rm drops
it. $TOOLFENCE_STORE does not apply here.

Example:
  toolfence demo
  toolfence demo --store ./demo-store && toolfence ls --store ./demo-store
  toolfence demo --rm
  toolfence demo --store postgres://toolfence@localhost:5432/toolfence`,
		Args: args(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			storeSet := cmd.Flags().Changed("store")
			if rm && storeSet && !isDSN(a.store) {
				return usagef("--rm removes only a store the demo creates (a temporary directory or a PostgreSQL schema); it never deletes your --store directory")
			}
			return a.demo(cmd.Context(), storeSet, rm)
		},
	}
	cmd.Flags().BoolVar(&rm, "rm", false, "remove the demo's temporary store (or drop its PostgreSQL schema) afterwards")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the store (the default now; kept so older scripts work)")
	_ = cmd.Flags().MarkHidden("keep")
	return cmd
}

func (a *app) demo(ctx context.Context, storeSet, rm bool) error {
	store := a.store
	switch {
	case storeSet && isDSN(store):
		// demo.Run creates a schema of its own in the database.
	case storeSet && isServerURL(store):
		return usagef("demo runs its story in a badger directory or a PostgreSQL database it opens itself, not through a server (--store %s)", store)
	case storeSet:
		// Fail early, with the usual message, when another process holds the store or the
		// directory is not one: the demo's processes need the store to themselves.
		l, err := openExclusive(store)
		if err != nil {
			return err
		}
		if err := l.Close(); err != nil {
			return fmt.Errorf("closing store %s: %w", store, err)
		}
	default:
		tmp, err := os.MkdirTemp("", "toolfence-demo-")
		if err != nil {
			return fmt.Errorf("creating a temporary store: %w", err)
		}
		store = tmp
		if rm {
			defer os.RemoveAll(tmp)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this binary to start the worker: %w", err)
	}

	rep, err := demo.Run(ctx, demo.Options{
		Store:     store,
		Keep:      !rm,
		Namespace: a.namespace,
		Out:       a.stdout,
		StartWorker: func(ctx context.Context, w demo.WorkerArgs) *exec.Cmd {
			c := exec.CommandContext(ctx, exe, append([]string{"demo-worker"}, w.Flags()...)...)
			// The store (a DSN may carry a password) goes in the environment, not in argv.
			c.Env = append(os.Environ(), storeEnv+"="+w.Store)
			return c
		},
	})
	if rep != nil {
		fmt.Fprintf(a.stdout, "charges at the API: %d\n", rep.Charges)
		a.demoKept(rep, rm)
	}
	return err
}

// demoKept tells on stderr where the demo's store is and how to look at it, or that it was
// removed.
//
// The commands name the binary as it was run (os.Args[0]: ./bin/toolfence under make demo,
// toolfence from the PATH), so they can be pasted as they are.
func (a *app) demoKept(rep *demo.Report, rm bool) {
	self := shellQuote(cmp.Or(os.Args[0], "toolfence"))
	ns := ""
	if a.namespace != interceptor.DefaultNamespace {
		ns = " --namespace " + shellQuote(a.namespace)
	}
	switch {
	case rm && rep.Schema != "":
		fmt.Fprintf(a.stderr, "schema %s dropped (--rm)\n", rep.Schema)
		return
	case rm:
		fmt.Fprintf(a.stderr, "store %s removed (--rm)\n", rep.Store)
		return
	case rep.Schema != "":
		store := shellQuote(displayStore(rep.Store))
		fmt.Fprintf(a.stderr, "schema %s kept; look at it with:\n  %s ls --store %s%s\n  %s show %s --store %s%s\n"+
			"(drop it with DROP SCHEMA %s CASCADE, or run the demo with --rm)\n", rep.Schema, self, store, ns, self, rep.Key, store, ns, rep.Schema)
	default:
		store := shellQuote(rep.Store)
		fmt.Fprintf(a.stderr, "store kept at %s; look at it with:\n  %s ls --store %s%s\n  %s show %s --store %s%s\n",
			rep.Store, self, store, ns, self, rep.Key, store, ns)
	}
}

// shellQuote returns s as one word for a POSIX shell: as is when it holds only characters
// no shell treats specially, else in single quotes.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:@%+=,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func newDemoWorkerCmd(a *app) *cobra.Command {
	var w demo.WorkerArgs
	cmd := &cobra.Command{
		Use:    "demo-worker",
		Short:  "The worker process of the demo (internal)",
		Hidden: true,
		Args:   args(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			w.Store, w.Namespace = a.store, a.namespace
			return demo.RunWorker(cmd.Context(), w, a.stdout)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&w.API, "api", "", "base URL of the payment API")
	fl.StringVar(&w.Task, "task", "", "task of the charge")
	fl.DurationVar(&w.LeaseTTL, "lease", demo.DefaultLeaseTTL, "lease of the charge")
	return cmd
}
