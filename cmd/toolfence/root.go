package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
)

// Exit codes of the binary.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// defaultStore is the store used when neither --store nor TOOLFENCE_STORE is set.
const defaultStore = "./.toolfence"

// storeEnv names the environment variable that overrides the default of --store.
const storeEnv = "TOOLFENCE_STORE"

// app is what every subcommand shares: the global flags and the output streams. A
// subcommand constructor receives it and reads a.store / a.namespace in its RunE (after
// flag parsing), and opens the store with a.open.
type app struct {
	// store is --store: a badger directory, a postgres:// DSN or an http(s):// server.
	store string
	// namespace is --namespace.
	namespace string
	// server, token and tokenFile are --server, --token and --token-file of the commands
	// that can act through a running `toolfence serve --http` (ls, show, resolve).
	server    string
	token     string
	tokenFile string
	stdout    io.Writer
	stderr    io.Writer
	// log is --log-format and --log-level of the commands that log (serve).
	log logFlags
	// minFree, set by serve's --min-free-mib before it opens the store, makes the owner of
	// a badger store refuse new reservations below this much free space; 0 (every other
	// command) is badger.DefaultMinFree.
	minFree uint64
	// allowAsyncReplicas is --allow-async-replicas of the commands that open a store.
	allowAsyncReplicas bool
}

// commands holds the constructors of subcommands defined in other files of this package.
// A file adds its command from an init function:
//
//	func init() { register(newServeCmd) }
//	func newServeCmd(a *app) *cobra.Command { … RunE: func(cmd *cobra.Command, args []string) error { l, err := a.open(cmd.Context(), true); … } }
//
// RunE errors exit with status 1; return usagef(…) for bad input (status 2).
var commands []func(a *app) *cobra.Command

// register adds a subcommand constructor; call it from init.
func register(newCmd func(a *app) *cobra.Command) { commands = append(commands, newCmd) }

// newRoot builds the whole command tree over fresh state, so tests can run it repeatedly.
func newRoot(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "toolfence",
		Short: "Make side-effecting tool calls of LLM agents safe to retry, crash and hand over",
		Long: `toolfence guards side-effecting tool calls (charge a card, send an email, deploy) so each
intended operation takes effect at most once, and an outcome nobody recorded is surfaced for
reconciliation instead of being silently replayed or repeated.

Every guarded call leaves a residual in a ledger store: pending while in flight, then
succeeded, failed, accepted (queued upstream) or unknown (it may have reached upstream; it
blocks until reconciled). These commands inspect and settle residuals.

The store is a badger directory (the embedded default), a PostgreSQL DSN (postgres://…),
or http(s)://HOST:PORT of a running toolfence serve --http (with a bearer token). It
defaults to ./.toolfence, or to $TOOLFENCE_STORE when set. Several toolfence processes may
use one badger directory at once: the first one serves it to the others on
DIR/toolfence.sock, and another takes over when it exits (docs/shared-store.md).

Example:
  toolfence demo                      # the crash-and-hand-over story; prints where its store is
  toolfence ls --state unknown        # residuals that need reconciling
  toolfence show tf1_3f1c09e2         # one residual (a unique key prefix is enough)
  toolfence resolve tf1_3f1c09e2 --as succeeded --note "charge ch_1 found in the dashboard"`,
		Version:       buildVersion(),
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetVersionTemplate("toolfence {{.Version}}\n")
	root.PersistentFlags().StringVar(&a.store, "store", cmp.Or(os.Getenv(storeEnv), defaultStore),
		"ledger store: a badger directory (shared by the processes that use it), a postgres:// DSN, or http(s)://HOST:PORT of a toolfence serve --http; $"+storeEnv+" overrides the default")
	root.PersistentFlags().StringVar(&a.namespace, "namespace", interceptor.DefaultNamespace,
		"namespace of the residuals (a tenant or environment)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)

	root.AddCommand(newLsCmd(a), newShowCmd(a), newResolveCmd(a), newGCCmd(a), newDemoCmd(a), newDemoWorkerCmd(a))
	for _, newCmd := range commands {
		root.AddCommand(newCmd(a))
	}
	sort.Sort(byName(root.Commands()))
	markRunErrors(root)
	return root
}

type byName []*cobra.Command

func (s byName) Len() int           { return len(s) }
func (s byName) Less(i, j int) bool { return s[i].Name() < s[j].Name() }
func (s byName) Swap(i, j int)      { s[i], s[j] = s[j], s[i] }

// run executes the command line args and returns the exit status: 0 ok, 1 error, 2 bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr}
	root := newRoot(a)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "toolfence: %v\n", err)
	var re runError
	if errors.As(err, &re) {
		return exitError
	}
	// A usageError from RunE, or an error of cobra's own (unknown command or flag, wrong
	// number of arguments).
	if cmd == nil {
		cmd = root
	}
	fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	return exitUsage
}

// usageError marks bad input: the exit status is 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef returns an error for bad input (exit status 2).
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// runError marks an error a command returned while running: the exit status is 1.
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// markRunErrors wraps the RunE of every command so its errors exit with status 1, except
// usage errors, which exit with 2. Errors cobra raises before RunE are usage errors.
func markRunErrors(c *cobra.Command) {
	if f := c.RunE; f != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			err := f(cmd, args)
			var ue usageError
			if err == nil || errors.As(err, &ue) {
				return err
			}
			return runError{err}
		}
	}
	for _, sub := range c.Commands() {
		markRunErrors(sub)
	}
}

// args returns a validator that wants exactly the named positional arguments.
func args(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, got []string) error {
		if len(got) == len(names) {
			return nil
		}
		if len(names) == 0 {
			return usagef("%s takes no arguments, got %q", cmd.CommandPath(), got)
		}
		return usagef("%s takes %d argument(s) %v, got %d", cmd.CommandPath(), len(names), names, len(got))
	}
}

// open opens the store named by --store (see openStore). With mustExist, a badger
// directory that is not a store yet, or a PostgreSQL schema without toolfence tables, is an
// error instead of being created. An http(s):// store is reached with the token of
// --token, --token-file or $TOOLFENCE_TOKEN, for --namespace.
func (a *app) open(ctx context.Context, mustExist bool) (ledger.Ledger, error) {
	o := storeOptions{mustExist: mustExist, namespace: a.namespace, minFree: a.minFree, allowAsyncReplicas: a.allowAsyncReplicas}
	if isDSN(a.store) {
		log, err := a.log.logger(a.stderr)
		if err != nil {
			log = slog.New(slog.NewTextHandler(a.stderr, nil))
		}
		o.log = log
	}
	if isServerURL(a.store) {
		tok, err := a.bearerToken()
		if err != nil {
			return nil, err
		}
		o.token = tok
	}
	return openStore(ctx, a.store, o)
}
