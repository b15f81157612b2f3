package remote_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/ledger/ledgertest"
	"github.com/toolfence/toolfence/ledger/remote"
)

func TestMain(m *testing.M) {
	if role := testkit.Role(); role != "" {
		runRole(role) // never returns
	}
	goleak.VerifyTestMain(m)
}

var start = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// swap serves whatever handler it holds, so a test can reopen the ledger behind a server.
type swap struct{ h atomic.Pointer[http.Handler] }

func (s *swap) set(h http.Handler)                               { s.h.Store(&h) }
func (s *swap) ServeHTTP(w http.ResponseWriter, r *http.Request) { (*s.h.Load()).ServeHTTP(w, r) }

// openBadger opens a badger ledger in dir on clock, closed at cleanup.
func openBadger(t *testing.T, dir string, clock lease.Clock) *badger.Ledger {
	t.Helper()
	l, err := badger.Open(dir, badger.Options{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// serve starts an HTTP server of h: on a TCP port (unix false) or a unix socket, and
// returns the endpoint.
func serve(t *testing.T, h http.Handler, unix bool) string {
	t.Helper()
	if !unix {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	dir, err := os.MkdirTemp("", "tfr")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return "unix:" + sock
}

// dial returns a client of endpoint, closed at cleanup.
func dial(t *testing.T, endpoint string, opts remote.Options) *remote.Client {
	t.Helper()
	c, err := remote.New(endpoint, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// harness runs the conformance suite against a Client of a Handler of a badger ledger on a
// fake clock; Reopen reopens the badger store behind the same server.
func harness(unix bool) ledgertest.Harness {
	return ledgertest.Harness{Open: func(t *testing.T) ledgertest.Fixture {
		dir := t.TempDir()
		clock := lease.NewFake(start)
		b := openBadger(t, dir, clock)
		sw := &swap{}
		sw.set(remote.Handler(b, remote.HandlerOptions{Authorize: remote.AllNamespaces()}))
		endpoint := serve(t, sw, unix)
		c := dial(t, endpoint, remote.Options{})
		return ledgertest.Fixture{
			Ledger:  c,
			Advance: func(_ *testing.T, d time.Duration) { clock.Advance(d) },
			Now:     func(*testing.T) time.Time { return clock.Now() },
			Reopen: func(t *testing.T) ledger.Ledger {
				require.NoError(t, c.Close())
				require.NoError(t, b.Close())
				b2 := openBadger(t, dir, clock)
				sw.set(remote.Handler(b2, remote.HandlerOptions{Authorize: remote.AllNamespaces()}))
				return dial(t, endpoint, remote.Options{})
			},
		}
	}}
}

func TestConformanceHTTP(t *testing.T) { ledgertest.Run(t, harness(false)) }

func TestConformanceUnixSocket(t *testing.T) { ledgertest.Run(t, harness(true)) }
