package badger

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// TestSpaceLevels: below MinFree new reservations are refused with ErrLowSpace and nothing
// is written, while a call reserved before still commits; below MinFree/2 evidence and
// resolutions are refused too, commits still land; below the floor every write is
// refused, reads go on; with space back, everything works again. The filesystem is
// simulated here by the injected reader (TestSpaceOnSmallFilesystem uses a real one).
func TestSpaceLevels(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var free atomic.Uint64
	free.Store(1 << 30)
	clock := lease.NewFake(start)
	l := openTest(t, dir, Options{Clock: clock, MinFree: 512 << 20, FreeSpace: func(got string) (uint64, error) {
		require.Equal(t, dir, got)
		return free.Load(), nil
	}})
	ctx := t.Context()
	floor := l.space.floor

	reserve := func(target string) (ledger.ReserveParams, *ledger.ReserveResult, error) {
		p := reserveParams(target)
		res, err := l.Reserve(ctx, p)
		return p, res, err
	}
	commit := func(p ledger.ReserveParams, res *ledger.ReserveResult) error {
		_, err := l.Commit(ctx, ledger.CommitParams{Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
			Outcome: residual.Succeeded, Result: []byte(`{"ok":true}`)})
		return err
	}
	evidence := func(p ledger.ReserveParams) error {
		_, err := l.AppendEvidence(ctx, ledger.EvidenceParams{Namespace: p.Namespace, Key: p.Key,
			Evidence: residual.Evidence{Holder: "h", Outcome: residual.Succeeded, Note: strings.Repeat("n", 1000)}})
		return err
	}
	p1, r1, err := reserve("one")
	require.NoError(t, err)
	p2, r2, err := reserve("two")
	require.NoError(t, err)
	p3, r3, err := reserve("three")
	require.NoError(t, err)
	p4 := reserveParams("expires")
	p4.TTL = time.Second
	_, err = l.Reserve(ctx, p4)
	require.NoError(t, err)
	clock.Advance(2 * time.Second) // p4 is unknown now: it takes a resolution

	free.Store(300 << 20) // below MinFree
	refused, _, err := reserve("new")
	require.ErrorIs(t, err, ErrLowSpace)
	require.ErrorContains(t, err, "300 MiB free")
	require.ErrorContains(t, err, "new reservations are refused")
	_, err = l.Get(ctx, ledger.GetParams{Namespace: refused.Namespace, Key: refused.Key})
	require.ErrorIs(t, err, residual.ErrNotFound, "nothing was written")
	require.NoError(t, evidence(p1), "evidence still lands above MinFree/2")
	require.NoError(t, commit(p1, r1), "a call in flight still commits")

	free.Store(200 << 20) // below MinFree/2
	require.ErrorIs(t, evidence(p2), ErrLowSpace)
	resolve := func() error {
		_, err := l.Resolve(ctx, ledger.ResolveParams{Namespace: p4.Namespace, Key: p4.Key, As: residual.Failed, By: "op", Note: "n"})
		return err
	}
	require.ErrorIs(t, resolve(), ErrLowSpace)
	require.NoError(t, commit(p2, r2), "a call in flight still commits")

	free.Store(floor - 1) // below the floor
	require.ErrorIs(t, commit(p3, r3), ErrLowSpace)
	got, err := l.Get(ctx, ledger.GetParams{Namespace: p3.Namespace, Key: p3.Key})
	require.NoError(t, err, "reads go on")
	require.Equal(t, residual.Pending, got.State)
	_, _, err = reserve("one")
	require.NoError(t, err, "a replay writes nothing and is answered")

	free.Store(1 << 30)
	require.NoError(t, commit(p3, r3))
	require.NoError(t, resolve())
	_, _, err = reserve("new")
	require.NoError(t, err, "reservations resume once space is back")
}

// TestOpenSpaceOptions: MinFree below twice the floor is refused; a filesystem with less
// than the floor free is refused at Open, before badger writes anything.
func TestOpenSpaceOptions(t *testing.T) {
	t.Parallel()
	_, err := Open(t.TempDir(), Options{MinFree: 1 << 20})
	require.ErrorIs(t, err, ledger.ErrInvalidParams)
	require.ErrorContains(t, err, "twice the floor")

	dir := t.TempDir()
	_, err = Open(dir, Options{FreeSpace: func(string) (uint64, error) { return 10 << 20, nil }})
	require.ErrorIs(t, err, ErrLowSpace)
	require.ErrorContains(t, err, "10 MiB free")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "badger wrote nothing")

	_, err = Open(dir, Options{FreeSpace: func(string) (uint64, error) { return 0, errors.New("statfs broke") }})
	require.ErrorContains(t, err, "statfs broke", "an unreadable free space fails closed")
}

func TestDiskFree(t *testing.T) {
	t.Parallel()
	n, err := DiskFree(t.TempDir())
	require.NoError(t, err)
	require.Positive(t, n)
	_, err = DiskFree("/no/such/dir")
	require.Error(t, err)
}

// spaceRoleEnv carries the role of the child of TestSpaceOnSmallFilesystem, spaceDirEnv
// its store.
const (
	spaceRoleEnv = "TOOLFENCE_SPACE_ROLE"
	spaceDirEnv  = "TOOLFENCE_SPACE_DIR"
)

// spaceOptions are the child's: badger's smallest memtables, so a 64 MiB filesystem holds
// many flushes, and a 16 MiB reserve.
func spaceOptions() Options { return Options{tiny: true, MinFree: 16 << 20} }

// TestSpaceChild is the child's side of TestSpaceOnSmallFilesystem; it returns at once in a
// normal test run. Its roles print one line per fact on stdout:
//   - fill: reserves a call, then reserves and commits calls with 32 KiB results until a
//     reservation is refused ("acked TARGET" after each commit, "refused ERR"), then
//     commits the first call ("acked inflight");
//   - open: opens the store on a full filesystem ("open-refused ERR");
//   - verify: checks that every target named in $TOOLFENCE_SPACE_ACKED is succeeded.
func TestSpaceChild(t *testing.T) {
	role, dir := os.Getenv(spaceRoleEnv), os.Getenv(spaceDirEnv)
	if role == "" {
		return
	}
	ctx := t.Context()
	switch role {
	case "fill":
		l, err := Open(dir, spaceOptions())
		require.NoError(t, err)
		defer l.Close()
		inflight := reserveParams("inflight")
		held, err := l.Reserve(ctx, inflight)
		require.NoError(t, err)
		result := []byte(`"` + strings.Repeat("r", 32<<10) + `"`)
		for i := range 5000 {
			p := reserveParams(fmt.Sprint("call-", i))
			res, err := l.Reserve(ctx, p)
			if err != nil {
				require.ErrorIs(t, err, ErrLowSpace)
				fmt.Println("refused", strings.ReplaceAll(err.Error(), "\n", " "))
				break
			}
			_, err = l.Commit(ctx, ledger.CommitParams{Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
				Outcome: residual.Succeeded, Result: result})
			require.NoError(t, err)
			fmt.Println("acked", p.Target)
		}
		_, err = l.Commit(ctx, ledger.CommitParams{Namespace: inflight.Namespace, Key: inflight.Key, Holder: inflight.Holder,
			Token: held.Lease.Token, Outcome: residual.Succeeded, Result: result})
		require.NoError(t, err, "a call in flight commits below MinFree")
		fmt.Println("acked inflight")
	case "open":
		l, err := Open(dir, spaceOptions())
		if err == nil {
			l.Close()
		}
		require.ErrorIs(t, err, ErrLowSpace)
		fmt.Println("open-refused", err)
	case "verify":
		l, err := Open(dir, spaceOptions())
		require.NoError(t, err)
		defer l.Close()
		for _, target := range strings.Fields(os.Getenv("TOOLFENCE_SPACE_ACKED")) {
			p := reserveParams(target)
			r, err := l.Get(ctx, ledger.GetParams{Namespace: p.Namespace, Key: p.Key})
			require.NoError(t, err, target)
			require.Equal(t, residual.Succeeded, r.State, target)
		}
		_, err = l.Reserve(ctx, reserveParams("after"))
		require.NoError(t, err, "reservations resume once space is back")
		fmt.Println("verified")
	default:
		t.Fatalf("unknown role %q", role)
	}
}

// runSpaceChild runs TestSpaceChild in role on dir and returns its output. A child that
// fails or dies of a signal (badger's SIGBUS on a full filesystem) fails the test.
func runSpaceChild(t *testing.T, role, dir string, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSpaceChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), spaceRoleEnv+"="+role, spaceDirEnv+"="+dir, "GORACE=atexit_sleep_ms=0")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.Fatalf("child %s died of %v:\n%s", role, ws.Signal(), out)
		}
	}
	require.NoError(t, err, "child %s:\n%s", role, out)
	return string(out)
}

// mountTmpfs mounts a tmpfs of size bytes on a new directory and unmounts it at cleanup.
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	testkit.NeedRoot(t, "mount a small tmpfs")
	mnt := filepath.Join(t.TempDir(), "fs")
	require.NoError(t, os.Mkdir(mnt, 0o700))
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "tmpfs", mnt).CombinedOutput()
	require.NoError(t, err, "mount: %s", out)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}

// fillTo writes a ballast file in dir until the filesystem has at most left bytes free (0:
// until it is full) and returns its path.
func fillTo(t *testing.T, dir string, left uint64) string {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf("ballast-%d", left))
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 256<<10)
	for range 1 << 16 { // bounded: 16 GiB at most
		avail, err := DiskFree(dir)
		require.NoError(t, err)
		if avail <= left || avail == 0 {
			return path
		}
		n := min(uint64(len(chunk)), avail-left)
		if left == 0 {
			n = uint64(len(chunk))
		}
		if _, err := f.Write(chunk[:n]); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			return path
		}
	}
	t.Fatal("the filesystem did not fill up")
	return ""
}

// TestSpaceOnSmallFilesystem runs a store on a real 64 MiB tmpfs: calls are reserved and
// committed until the filesystem nears full, where new reservations are refused while the
// call in flight still commits; on a full filesystem Open fails with a clear error (a
// child process: badger's SIGBUS would show); once space is freed, every acknowledged
// commit is there and reservations resume.
func TestSpaceOnSmallFilesystem(t *testing.T) {
	mnt := mountTmpfs(t, 64<<20)
	store := filepath.Join(mnt, "store")
	ballast := fillTo(t, mnt, 28<<20) // leave 28 MiB, of which the store may use 12

	out := runSpaceChild(t, "fill", store)
	var acked []string
	for _, line := range strings.Split(out, "\n") {
		if target, ok := strings.CutPrefix(line, "acked "); ok {
			acked = append(acked, target)
		}
	}
	require.Contains(t, out, "refused ", "reservations were refused before the filesystem was full")
	require.Contains(t, out, "new reservations are refused")
	require.Contains(t, acked, "inflight")
	require.Greater(t, len(acked), 10, "calls were committed before the reserve was reached")
	avail, err := DiskFree(mnt)
	require.NoError(t, err)
	t.Logf("%d commits acknowledged; %d MiB left free", len(acked), avail>>20)
	require.GreaterOrEqual(t, avail, uint64(8<<20), "the guard kept space free")

	full := fillTo(t, mnt, 0)
	out = runSpaceChild(t, "open", store)
	require.Contains(t, out, "open-refused")
	require.Contains(t, out, "needs at least")

	require.NoError(t, os.Remove(full))
	require.NoError(t, os.Remove(ballast))
	out = runSpaceChild(t, "verify", store, "TOOLFENCE_SPACE_ACKED="+strings.Join(acked, " "))
	require.Contains(t, out, "verified")
}
