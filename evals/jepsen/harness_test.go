package jepsen

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
)

// TestMain runs a worker when the harness re-executes the test binary as one.
func TestMain(m *testing.M) {
	if IsWorker() {
		os.Exit(WorkerMain())
	}
	os.Exit(m.Run())
}

// runShort runs the harness with every fault kind of the backend scheduled once or more and
// requires a clean verdict.
func runShort(t *testing.T, cfg Options) *Report {
	t.Helper()
	// The report stays behind when the test fails, so the history can be read.
	dir, err := os.MkdirTemp("", "toolfence-"+t.Name()+"-")
	require.NoError(t, err)
	t.Cleanup(func() {
		if !t.Failed() {
			_ = os.RemoveAll(dir)
		}
	})
	cfg.Dir = dir
	cfg.Args = []string{"-test.run=^$"}
	cfg.Log = testWriter{t}
	rep, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	v := rep.Verdict
	for _, f := range cfg.Faults {
		require.Positive(t, rep.Injected[f], "fault %s was never injected", f)
	}
	for _, f := range rep.Faults {
		require.NotContains(t, f.Detail, "FAILED", "fault %s", f.Kind)
	}
	require.Greater(t, v.Ops, 300, "the workload ran")
	require.True(t, v.OK(), "%s\nviolations: %v\nwindow:\n%s\nreport in %s", v, v.Violations, strings.Join(v.Window, "\n"), cfg.Dir)
	return rep
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// TestJepsenBadger: process kills (store reopened by a new process), stops and forward
// jumps of the ledger's clock, each at least twice, with a checked history.
func TestJepsenBadger(t *testing.T) {
	testkit.SkipShort(t, "a 14 s fault run")
	rep := runShort(t, Options{Backend: "badger", Duration: 14 * time.Second, Clients: 6, Slots: 2, Epoch: 3 * time.Second,
		FaultFor: time.Second, Quiet: time.Second, Faults: BadgerFaults, Seed: 1})
	require.GreaterOrEqual(t, rep.Procs, 2, "a killed worker was replaced")
}

// TestJepsenPostgres: every fault kind against a throwaway cluster, with a checked history;
// the failover fault promotes a synchronous standby after crashing the primary.
func TestJepsenPostgres(t *testing.T) {
	testkit.SkipShort(t, "starts a PostgreSQL cluster for a 32 s fault run")
	rep := runShort(t, Options{Backend: "postgres", Duration: 32 * time.Second, Workers: 3, Clients: 3, Slots: 3,
		Epoch: 4 * time.Second, FaultFor: time.Second, Quiet: 700 * time.Millisecond, Faults: PostgresFaults, Seed: 1})
	require.GreaterOrEqual(t, rep.Procs, 4, "a killed worker was replaced")
}

// TestJepsenFailoverAsynchronousIsCaught: a planted loss. The standby is asynchronous (the
// workers allow it), so each failover loses what the primary acknowledged while the
// standby was held behind: the checks must find it.
func TestJepsenFailoverAsynchronousIsCaught(t *testing.T) {
	testkit.SkipShort(t, "starts two PostgreSQL clusters")
	dir := t.TempDir()
	rep, err := Run(context.Background(), Options{Backend: "postgres", Duration: 10 * time.Second, Workers: 2, Clients: 3,
		Slots: 3, Epoch: 4 * time.Second, FaultFor: 1500 * time.Millisecond, Quiet: 2 * time.Second,
		Faults: []string{FFailover}, AsyncStandby: true, Seed: 2, Dir: dir, Args: []string{"-test.run=^$"}, Log: testWriter{t}})
	require.NoError(t, err)
	require.Positive(t, rep.Injected[FFailover])
	for _, f := range rep.Faults {
		require.NotContains(t, f.Detail, "FAILED", "fault %s", f.Kind)
	}
	v := rep.Verdict
	t.Logf("%s; first violation: %s", v, first(v.Violations))
	require.False(t, v.OK(), "a failover to an asynchronous standby lost acknowledged writes; the checks must say so")
}

func first(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return s[0]
}
