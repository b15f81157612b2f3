package mcpproxy_test

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// pipeSession is one proxy session served over real pipes, as `toolfence proxy` serves a host
// on its stdio and a stdio upstream, with the proxy on a fresh badger store.
type pipeSession struct {
	l  *badger.Ledger
	ic *interceptor.Interceptor
	// hostW and upW are what the host and the upstream write to the proxy; hostR and upR
	// read what the proxy writes to each.
	hostW, hostR, upW, upR *os.File
	// proxyOut and toUp are the proxy's write ends towards the host and the upstream:
	// Serve does not close them, so closing one (after Serve returned) ends hostR or upR.
	proxyOut, toUp *os.File
	served         <-chan error
}

// newPipeSession starts Serve with an interceptor of iopts and a proxy of popts; the session
// ends with the test.
func newPipeSession(t *testing.T, iopts interceptor.Options, popts mcpproxy.Options) *pipeSession {
	t.Helper()
	l, err := badger.Open(filepath.Join(t.TempDir(), "store"), badger.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	ic, err := interceptor.New(l, iopts)
	require.NoError(t, err)
	p, err := mcpproxy.New(ic, popts)
	require.NoError(t, err)
	pipe := func() (*os.File, *os.File) {
		r, w, err := os.Pipe()
		require.NoError(t, err)
		t.Cleanup(func() { r.Close(); w.Close() })
		return r, w
	}
	s := &pipeSession{l: l, ic: ic}
	var hostIn, fromUp *os.File
	hostIn, s.hostW = pipe()
	s.hostR, s.proxyOut = pipe()
	s.upR, s.toUp = pipe()
	fromUp, s.upW = pipe()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, transport.Stdio(hostIn, s.proxyOut), transport.Stdio(fromUp, s.toUp)) }()
	s.served = served
	return s
}

// readLineWithin returns the next line of r, failing the test when none comes within 10 s.
func readLineWithin(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		line, _ := r.ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		return line
	case <-time.After(10 * time.Second):
		t.Fatal("no line within 10 s")
		return ""
	}
}
