package httpguard_test

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/httpguard"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/testkit/crashtest"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

const crashDirEnv = "TOOLFENCE_HTTPGUARD_CRASH_DIR"

// TestCrashChild is the child of TestProcessDiesMidRequest (see internal/testkit/crashtest): a
// guarded server on a real listener (it marks "listening <addr>") whose handler marks
// "in-handler" and hangs until the process is killed. It returns at once in a normal run.
func TestCrashChild(t *testing.T) {
	crashtest.Run(t, map[string]func(t *testing.T){"mid-request": func(t *testing.T) {
		store, err := badger.Open(os.Getenv(crashDirEnv), badger.Options{})
		require.NoError(t, err)
		ic, err := interceptor.New(store, interceptor.Options{Holder: "doomed-api", LeaseTTL: 2 * time.Second})
		require.NoError(t, err)
		g, err := httpguard.New(ic, httpguard.Options{Principal: bearer, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			crashtest.Mark("in-handler", "")
			crashtest.Hang()
		}))
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		crashtest.Mark("listening", ln.Addr().String())
		_ = http.Serve(ln, h)
	}})
}

// The process dies (SIGKILL) while the handler runs: the reservation was durable before the
// handler started, so the restarted server answers every retry with 409 "being reconciled"
// and never runs the handler again.
func TestProcessDiesMidRequest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	child := crashtest.Start(t, "mid-request", crashDirEnv+"="+dir)
	addr := child.Await("listening")
	failed := make(chan error, 1)
	go func() {
		res, err := http.DefaultClient.Do(post("/charges", keyA, `{"amount":50}`).build("http://" + addr))
		if err == nil {
			res.Body.Close()
			err = fmt.Errorf("unexpected answer %d", res.StatusCode)
		}
		failed <- err
	}()
	child.Await("in-handler")
	child.Kill()
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
