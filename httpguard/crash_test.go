package httpguard_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/httpguard"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

const crashDirEnv = "TOOLFENCE_HTTPGUARD_CRASH_DIR"

// TestCrashHelper is the child of TestProcessDiesMidRequest: a guarded server on a real
// listener whose handler announces itself and blocks until the process is killed. It
// returns at once in a normal test run.
func TestCrashHelper(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		return
	}
	store, err := badger.Open(dir, badger.Options{})
	require.NoError(t, err)
	ic, err := interceptor.New(store, interceptor.Options{Holder: "doomed-api", LeaseTTL: 2 * time.Second})
	require.NoError(t, err)
	g, err := httpguard.New(ic, httpguard.Options{Principal: bearer, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("in-handler")
		_, _ = io.Copy(io.Discard, os.Stdin) // block until killed (or the parent goes away)
		os.Exit(3)
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fmt.Println("listening", ln.Addr())
	_ = http.Serve(ln, h)
}

// The process dies (SIGKILL) while the handler runs: the reservation was durable before the
// handler started, so the restarted server answers every retry with 409 "being reconciled"
// and never runs the handler again.
func TestProcessDiesMidRequest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(stdout)

	require.True(t, lines.Scan(), "child did not start")
	addr, ok := strings.CutPrefix(lines.Text(), "listening ")
	require.True(t, ok, lines.Text())
	failed := make(chan error, 1)
	go func() {
		res, err := http.DefaultClient.Do(post("/charges", keyA, `{"amount":50}`).build("http://" + addr))
		if err == nil {
			res.Body.Close()
			err = fmt.Errorf("unexpected answer %d", res.StatusCode)
		}
		failed <- err
	}()
	require.True(t, lines.Scan())
	require.Equal(t, "in-handler", lines.Text())
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	require.Error(t, <-failed, "the client saw the connection die")

	// Restart on the same store an hour later (the dead process's lease has expired).
	f := setup(t, func(o *setupOpts) {
		o.dir = dir
		o.clock = lease.NewFake(time.Now().Add(time.Hour))
	})
	require.Equal(t, residual.Unknown, f.residualOf("alice", keyA).State)
	for _, tr := range f.transports() {
		r := tr.send(t, post("/charges", keyA, `{"amount":50}`))
		require.Equal(t, http.StatusConflict, r.status)
		require.Equal(t, httpguard.ProblemReconciling, r.problem(t).Type)
	}
	require.Zero(t, f.api.charges.Load(), "the restarted server never ran the handler")
}
