package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/evals/jepsen"
)

func init() {
	register(newJepsenCmd)
	register(newJepsenWorkerCmd)
}

type jepsenFlags struct {
	backends     string
	duration     time.Duration
	workers      int
	clients      int
	slots        int
	epoch        time.Duration
	faultFor     time.Duration
	quiet        time.Duration
	faults       string
	dir          string
	seed         uint64
	checkTimeout time.Duration
	asyncStandby bool
}

func newJepsenCmd(a *app) *cobra.Command {
	var f jepsenFlags
	cmd := &cobra.Command{
		Use:   "jepsen",
		Short: "Check the ledgers' histories for linearizability under faults (internal)",
		Long: `Run clients in several worker processes against a ledger while a nemesis injects faults,
then check the recorded history for linearizability (porcupine) and the fencing invariants.

PostgreSQL runs start a throwaway cluster (initdb and pg_ctl on PATH; as root it runs as
the postgres user) on a free port, with a fault proxy between the clients and it; the
machine's own server is never touched. Faults: kill, stop, terminate, latency, bandwidth,
reset, timeout, partition, skew, restart, failover (the primary crashes while its standby
is held behind, the standby is promoted; the standby is synchronous unless
--async-standby, which must then be caught losing writes). Badger runs one worker process
at a time (its directory lock) with kill, stop and skew; add power (--faults
kill,skew,stop,power) to put its store on a FUSE filesystem that drops everything unsynced
at each cut (needs root and /dev/fuse; evals/lazyfs).

Each run writes history.jsonl, verdict.json, report.json and workers.log (and, on a
violation, violation.html) into --dir/<backend>. The exit status is 1 when a verdict is not
clean. See docs/reliability.md.

Example:
  toolfence jepsen --backend postgres --duration 10m --dir jepsen-out`,
		Hidden: true,
		Args:   args(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			bad := 0
			for _, b := range strings.Split(f.backends, ",") {
				cfg := jepsen.Options{Backend: strings.TrimSpace(b), Duration: f.duration, Workers: f.workers,
					Clients: f.clients, Slots: f.slots, Epoch: f.epoch, FaultFor: f.faultFor, Quiet: f.quiet,
					Dir: filepath.Join(f.dir, strings.TrimSpace(b)), Exe: exe, Args: []string{"jepsen-worker"},
					Seed: f.seed, CheckTimeout: f.checkTimeout, Log: a.stdout, AsyncStandby: f.asyncStandby}
				if f.faults != "" {
					cfg.Faults = strings.Split(f.faults, ",")
				}
				rep, err := jepsen.Run(cmd.Context(), cfg)
				if err != nil {
					return err
				}
				if p := rep.Power; p != nil {
					fmt.Fprintf(a.stdout, "%s: %d power cuts (the final one included) dropped %v; the ledger fsynced files %d times, directories %d times\n",
						cfg.Backend, p.Cuts, p.Dropped, p.FileSyncs, p.DirSyncs)
				}
				if !rep.Verdict.OK() {
					bad++
					fmt.Fprintf(a.stdout, "%s: NOT CLEAN: %s\n", cfg.Backend, rep.Verdict)
					for _, v := range rep.Verdict.Violations {
						fmt.Fprintf(a.stdout, "  %s\n", v)
					}
					for _, w := range rep.Verdict.Window {
						fmt.Fprintf(a.stdout, "  %s\n", w)
					}
				}
			}
			if bad > 0 {
				return fmt.Errorf("%d of the runs found violations; reports in %s", bad, f.dir)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.backends, "backend", "badger,postgres", "backends to run, comma-separated: badger, postgres")
	fl.DurationVar(&f.duration, "duration", time.Minute, "workload time per backend")
	fl.IntVar(&f.workers, "workers", 0, "worker processes at a time (PostgreSQL; default 3)")
	fl.IntVar(&f.clients, "clients", 0, "clients per worker process (default 3)")
	fl.IntVar(&f.slots, "slots", 0, "keys in use at once (default 3)")
	fl.DurationVar(&f.epoch, "epoch", 0, "how long a set of keys is used before moving on (default 5s)")
	fl.DurationVar(&f.faultFor, "fault-for", 0, "how long each fault lasts (default 1.5s)")
	fl.DurationVar(&f.quiet, "quiet", 0, "healthy time between faults (default 1s)")
	fl.StringVar(&f.faults, "faults", "", "fault schedule, comma-separated (default: every kind of the backend but power)")
	fl.StringVar(&f.dir, "dir", "jepsen-out", "report directory")
	fl.Uint64Var(&f.seed, "seed", 0, "workload seed (default: the time)")
	fl.DurationVar(&f.checkTimeout, "check-timeout", 10*time.Minute, "bound on the linearizability check")
	fl.BoolVar(&f.asyncStandby, "async-standby", false, "failover fault: an asynchronous standby (a planted loss: the verdict should not be clean)")
	hideGlobalFlags(cmd)
	return cmd
}

func newJepsenWorkerCmd(*app) *cobra.Command {
	return &cobra.Command{
		Use:                "jepsen-worker",
		Short:              "A worker process of jepsen (internal)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(*cobra.Command, []string) error {
			if !jepsen.IsWorker() {
				return usagef("jepsen-worker is started by toolfence jepsen, with %s set", jepsen.WorkerEnv)
			}
			if code := jepsen.WorkerMain(); code != 0 {
				return fmt.Errorf("jepsen worker exited %d", code)
			}
			return nil
		},
	}
}
