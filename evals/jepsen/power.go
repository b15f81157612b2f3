package jepsen

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/toolfence/toolfence/evals/lazyfs"
)

// FPower is a power cut (badger): the worker process is SIGKILLed and, at the same moment
// as far as the store can tell, the lazy FS under the store drops everything that was not
// fsynced; a new worker process reopens the store. With it in the schedule the badger
// store lives on a lazy FS (evals/lazyfs) served by the harness process, for every
// fault of the run. It needs /dev/fuse and root (see lazyfs.Available).
const FPower = "power"

// PowerReport says what the power cuts of a run did.
type PowerReport struct {
	// Counters are the lazy FS's, over the run (the final cut included).
	lazyfs.Counters
	// Final is what the cut after the workers stopped (closed the store) dropped; the
	// final reads read what it left.
	Final lazyfs.CutStats `json:"final"`
}

// power is the lazy FS of a run with FPower in its schedule.
type power struct {
	fs    *lazyfs.FS
	mnt   string
	final lazyfs.CutStats
	// died counts worker processes found exited when a cut came for them: after a cut
	// the only reason is a store that did not open (workers.log says why).
	died int
	// reopen is the error of opening the store for the final reads, after the final cut.
	reopen error
}

func (hs *harness) hasPower() bool {
	return hs.cfg.Backend == "badger" && slices.Contains(hs.cfg.Faults, FPower)
}

// setupPower mounts a lazy FS at Dir/mnt (durable contents in Dir/lazyfs) and puts the
// store in it.
func (hs *harness) setupPower() error {
	if err := lazyfs.Available(); err != nil {
		return fmt.Errorf("jepsen: fault %s: %w", FPower, err)
	}
	backing := filepath.Join(hs.cfg.Dir, "lazyfs")
	if err := os.RemoveAll(backing); err != nil {
		return err
	}
	f, err := lazyfs.New(backing)
	if err != nil {
		return err
	}
	mnt := filepath.Join(hs.cfg.Dir, "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return err
	}
	if err := f.Mount(mnt); err != nil {
		return err
	}
	hs.power = &power{fs: f, mnt: mnt}
	hs.store = filepath.Join(mnt, "store")
	return nil
}

// powerCut waits a random part of FaultFor, so that cuts do not follow the schedule's
// rhythm, then kills worker n's process, cuts the power and starts a new process.
func (hs *harness) powerCut(ctx context.Context, n int) (string, error) {
	hs.mu.Lock()
	wait := time.Duration(hs.rng.Int64N(int64(hs.cfg.FaultFor)))
	hs.mu.Unlock()
	sleep(ctx, wait)
	w := hs.worker(n)
	select {
	case <-w.done:
		hs.power.died++
		return "", fmt.Errorf("worker process %d had exited by itself: did the store not open after the last cut? (see workers.log)", w.proc)
	default:
	}
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return "", err
	}
	<-w.done
	st, err := hs.power.fs.Cut()
	if err != nil {
		return "", err
	}
	if err := hs.spawn(w.slot); err != nil {
		return "", err
	}
	return fmt.Sprintf("SIGKILL worker process %d (pid %d) and cut the power: dropped %v; process %d reopens the store",
		w.proc, w.cmd.Process.Pid, st, hs.procs-1), nil
}

// finalPowerCut runs after the workers stopped: one more cut, then the store as it left is
// exported (hard links) to Dir/store-after-cut, where the final reads open it (this
// process serves the FS, so it must not map the store's files through it).
func (hs *harness) finalPowerCut() error {
	if hs.power == nil {
		return nil
	}
	st, err := hs.power.fs.Cut()
	if err != nil {
		return fmt.Errorf("jepsen: final power cut: %w", err)
	}
	hs.power.final = st
	fmt.Fprintf(hs.cfg.Log, "jepsen %s: final power cut: dropped %v\n", hs.cfg.Backend, st)
	out := filepath.Join(hs.cfg.Dir, "store-after-cut")
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	if err := hs.power.fs.Export(out); err != nil {
		return fmt.Errorf("jepsen: export the store after the final cut: %w", err)
	}
	hs.store = filepath.Join(out, "store")
	return nil
}

// powerLost records err, the final reads' failure to open the store, as a finding of a
// power run (a store that does not open after a power cut has lost every acknowledged
// write) and reports whether it did.
func (hs *harness) powerLost(err error) bool {
	if hs.power == nil {
		return false
	}
	hs.power.reopen = err
	return true
}

// powerViolations are the findings of a power run that the history cannot show: a store
// that did not open after a cut.
func (hs *harness) powerViolations() []string {
	if hs.power == nil {
		return nil
	}
	var out []string
	if hs.power.died > 0 {
		out = append(out, fmt.Sprintf("%d worker processes exited by themselves after power cuts (the store did not open? see workers.log)", hs.power.died))
	}
	if hs.power.reopen != nil {
		out = append(out, fmt.Sprintf("the store does not open after the final power cut: %v", hs.power.reopen))
	}
	return out
}

func (hs *harness) powerReport() *PowerReport {
	if hs.power == nil {
		return nil
	}
	return &PowerReport{Counters: hs.power.fs.Counters(), Final: hs.power.final}
}

func (hs *harness) teardownPower() {
	if hs.power != nil {
		_ = hs.power.fs.Close()
	}
}
