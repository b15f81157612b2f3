package main

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/evals"
	"github.com/toolfence/toolfence/interceptor"
)

func init() {
	register(newEvalCmd)
	register(newEvalWorkerCmd)
	register(newEvalSinkCmd)
	register(newEvalPaymentsCmd)
	register(newEvalRelayCmd)
}

// pgEnv names the environment variable whose DSN enables the toolfence-postgres subject.
const pgEnv = "TOOLFENCE_TEST_PG"

func newEvalCmd(a *app) *cobra.Command {
	cfg := evals.Options{}
	var pg string
	var noPG bool
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Kill agents mid-tool-call and grade every outcome, against baselines",
		Long: `eval runs the crash-simulation suite: worker processes run a guarded tool call against an
effect sink (a separate process that logs every effect it performs) and are SIGKILLed or
SIGSTOPped at named barriers; successors retry the task. Every trial is graded from the sink's
log: EXACTLY_ONCE, DUPLICATED, DIVERGED, LOST, FABRICATED or BLOCKED (report.md defines
each in a sentence).

Subjects: toolfence on badger (with and without a probe), toolfence on PostgreSQL (when
--pg or $` + pgEnv + ` answers), and the baselines none, record-after, check-then-insert,
expiring-in-progress and mark-before. The MCP proxy subjects run crash-b0, crash-b1,
crash-b2 and zombie only: toolfence-proxy (an MCP host calls a payments MCP server through
a real "toolfence proxy" process, killed or stopped with the host) and its baseline
pass-through (the same host and server behind a relay that forwards every byte); the host
speaks MCP --host-revision. Every subject works in stores the eval creates and removes
itself, so --store and --namespace do not apply. docs/evals.md describes the scenarios,
subjects and grades and the latest full run.

Trials run in batches: a worker process carries --batch trials of one cell at once (each
with its own intent, task and agents, graded on its own) and is killed at the barrier once
every trial of the batch reached it; --parallel batches run at once.

It prints the scenario × subject table, writes report.json, report.md and report.svg into
--out, and exits with status 1 when any toolfence trial is DUPLICATED, DIVERGED, LOST or
FABRICATED.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, name := range []string{"store", "namespace"} {
				if cmd.Flags().Changed(name) {
					return usagef("--%s does not apply to eval: it creates and removes stores of its own (--pg names the PostgreSQL database)", name)
				}
			}
			if cfg.Trials <= 0 {
				return usagef("--trials must be positive")
			}
			if cfg.Batch < 0 || cfg.Parallel <= 0 {
				return usagef("--batch must not be negative and --parallel must be positive")
			}
			if !slices.Contains(evals.HostRevisions, cfg.HostRevision) {
				return usagef("--host-revision %q: the proxy subjects' host speaks %s", cfg.HostRevision, strings.Join(evals.HostRevisions, " or "))
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Command = func(role string, args ...string) *exec.Cmd {
				if role == "proxy" {
					return exec.Command(exe, append([]string{"proxy"}, args...)...) // the real command
				}
				return exec.Command(exe, append([]string{"eval-" + role}, args...)...)
			}
			pg = cmp.Or(pg, os.Getenv(pgEnv))
			if pg == "" && !noPG {
				fmt.Fprintf(a.stderr, "toolfence eval: no PostgreSQL DSN (--pg or $%s); skipping toolfence-postgres\n", pgEnv)
			}
			if pg != "" && !noPG {
				if err := evals.PostgresAvailable(cmd.Context(), pg); err != nil {
					fmt.Fprintf(a.stderr, "toolfence eval: PostgreSQL does not answer (%v); skipping toolfence-postgres\n", err)
				} else {
					cfg.PostgresDSN = pg
				}
			}
			cfg.Progress = a.stderr
			rep, err := evals.Run(cmd.Context(), cfg)
			if errors.Is(err, interceptor.ErrInvalidOptions) {
				return usagef("%v", err)
			}
			if err != nil {
				return err
			}
			fmt.Fprint(a.stdout, rep.Table())
			if cfg.Out != "" {
				fmt.Fprintf(a.stdout, "report written to %s/report.{json,md,svg}\n", cfg.Out)
			}
			if rep.Failed() {
				return fmt.Errorf("a toolfence subject had DUPLICATED, DIVERGED, LOST or FABRICATED trials (see %s/report.md)", cfg.Out)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&cfg.Trials, "trials", 4, "trials per scenario × subject cell")
	fl.Int64Var(&cfg.Seed, "seed", 1, "seed of the trial order and the scenarios' random choices")
	fl.StringVar(&cfg.Out, "out", "eval-report", "directory for report.json, report.md and report.svg (empty: none)")
	fl.StringSliceVar(&cfg.Scenarios, "scenarios", nil, "scenarios to run (default all)")
	fl.StringSliceVar(&cfg.Subjects, "subjects", nil, "subjects to run (default all available)")
	fl.StringVar(&pg, "pg", "", "PostgreSQL DSN for toolfence-postgres (default $"+pgEnv+")")
	fl.BoolVar(&noPG, "no-pg", false, "skip toolfence-postgres even when a DSN is set")
	fl.IntVar(&cfg.Parallel, "parallel", 2, "batches run at once")
	fl.IntVar(&cfg.Batch, "batch", 0, "trials of one cell per worker process, run at once in it and killed together (default min(trials, 500))")
	fl.IntVar(&cfg.StressMessages, "stress-messages", 500, "messages of the stress-redelivery scenario (the full run uses 10000)")
	fl.DurationVar(&cfg.LeaseTTL, "lease", 500*time.Millisecond, "toolfence lease and baseline pending TTL (real time)")
	fl.StringVar(&cfg.HostRevision, "host-revision", evals.HostRevisions[0], "MCP revision the proxy subjects' host asks for: "+strings.Join(evals.HostRevisions, " or "))
	hideGlobalFlags(cmd)
	return cmd
}

func newEvalWorkerCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:                "eval-worker",
		Short:              "A worker process of the eval (internal)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := evals.WorkerMain(cmd.Context(), args, a.stdout); code != 0 {
				return fmt.Errorf("eval worker exited %d", code)
			}
			return nil
		},
	}
}

func newEvalSinkCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:                "eval-sink",
		Short:              "The effect sink of the eval (internal): --addr 127.0.0.1:0 --log FILE",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			if code := evals.SinkMain(args, a.stdout); code != 0 {
				return fmt.Errorf("eval sink exited %d", code)
			}
			return nil
		},
	}
}

func newEvalPaymentsCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:                "eval-payments",
		Short:              "The payments MCP server of the eval's proxy subjects (internal): --sink URL [--hold]",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			if code := evals.PaymentsMain(args); code != 0 {
				return fmt.Errorf("eval payments exited %d", code)
			}
			return nil
		},
	}
}

func newEvalRelayCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:                "eval-relay",
		Short:              "The pass-through baseline of the eval (internal): -- CMD ARGS...",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			if code := evals.RelayMain(args); code != 0 {
				return fmt.Errorf("eval relay exited %d", code)
			}
			return nil
		},
	}
}

// hideGlobalFlags leaves the root's --store and --namespace out of cmd's help, for a command
// they do not apply to.
func hideGlobalFlags(cmd *cobra.Command) {
	cmd.SetHelpFunc(func(c *cobra.Command, args []string) {
		for _, name := range []string{"store", "namespace"} {
			if f := c.InheritedFlags().Lookup(name); f != nil {
				f.Hidden = true
			}
		}
		c.Root().HelpFunc()(c, args)
	})
}
