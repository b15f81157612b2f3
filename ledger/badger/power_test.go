package badger_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/evals/jepsen"
	"github.com/toolfence/toolfence/evals/lazyfs"
	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger/badger"
)

// TestPowerWorker is a worker process of TestPowerLossCatchesSkippedDirSync's harness
// (TestMain planted the bug first); it returns at once in a normal test run.
func TestPowerWorker(t *testing.T) {
	if !jepsen.IsWorker() {
		return
	}
	os.Exit(jepsen.WorkerMain())
}

// TestPowerLossCatchesSkippedSync: with every other WAL sync planted away, a round
// acknowledges commits that only the next round makes durable; power cuts in between lose
// them and the checker must say so. Process kills alone cannot catch it: a killed
// process's writes stay in the kernel's page cache.
func TestPowerLossCatchesSkippedSync(t *testing.T) {
	testkit.SkipShort(t, "mounts a FUSE filesystem and runs workers for 8 s")
	if err := lazyfs.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true: the power-cut tests must run)", err)
		}
		t.Skip(err)
	}
	t.Setenv(badger.PlantEnv, badger.PlantSkipWALSync) // inherited by the workers only: TestMain ran already
	dir, err := os.MkdirTemp("", "toolfence-"+t.Name()+"-")
	require.NoError(t, err)
	t.Cleanup(func() {
		if !t.Failed() {
			_ = os.RemoveAll(dir)
		}
	})
	// A cut catches the planted bug only when it falls between an acknowledged, unsynced
	// commit and the next round: most runs show it (6 of 6 when it was planted), one in CI
	// did not, so a run that shows nothing is tried again with the next seed, up to three.
	var v *jepsen.Verdict
	for seed := uint64(1); seed <= 3; seed++ {
		rep, err := jepsen.Run(context.Background(), jepsen.Options{Backend: "badger", Duration: 8 * time.Second, Clients: 6,
			Slots: 2, Epoch: 3 * time.Second, FaultFor: time.Second, Quiet: 700 * time.Millisecond,
			Faults: []string{jepsen.FPower}, Seed: seed, Dir: filepath.Join(dir, fmt.Sprint(seed)), Args: []string{"-test.run=^TestPowerWorker$"}, Log: logWriter{t}})
		require.NoError(t, err)
		v = rep.Verdict
		t.Logf("seed %d: %s; violations %v; power %+v", seed, v, v.Violations, *rep.Power)
		require.Positive(t, rep.Power.Cuts)
		require.Greater(t, v.Ops, 300, "the workload ran")
		if v.Linearizable == "Illegal" {
			break
		}
	}
	require.Equal(t, "Illegal", v.Linearizable, "a power cut after an acknowledged, unsynced commit must show as lost in one of three runs; reports in %s", dir)
}

// logWriter writes the harness's progress lines to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
