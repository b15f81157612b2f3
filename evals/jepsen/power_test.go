package jepsen

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/evals/lazyfs"
	"github.com/toolfence/toolfence/internal/testkit"
)

// requireLazyFS skips t where a lazy FS cannot be mounted, and fails it under CI=true
// (.ci/run installs fuse3; the harness runs as root there).
func requireLazyFS(t *testing.T) {
	t.Helper()
	testkit.SkipShort(t, "mounts a FUSE filesystem")
	if err := lazyfs.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true: the power-cut tests must run)", err)
		}
		t.Skip(err)
	}
}

// TestJepsenBadgerPower: power cuts (worker SIGKILLed, unsynced state of the store's
// filesystem dropped, store reopened) between process kills, with a checked history.
func TestJepsenBadgerPower(t *testing.T) {
	requireLazyFS(t)
	rep := runShort(t, Options{Backend: "badger", Duration: 16 * time.Second, Clients: 6, Slots: 2, Epoch: 3 * time.Second,
		FaultFor: time.Second, Quiet: 700 * time.Millisecond, Faults: []string{FPower, FKill, FPower}, Seed: 1})
	t.Logf("power: %+v", *rep.Power)
	require.GreaterOrEqual(t, rep.Injected[FPower], 4)
	require.Equal(t, rep.Injected[FPower]+1, rep.Power.Cuts, "every cut was counted, the final one too")
	require.Positive(t, rep.Power.DirSyncs, "the ledger synced directory entries")
}
