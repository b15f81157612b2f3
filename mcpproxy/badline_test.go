package mcpproxy_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpproxy"
)

// stdioSession serves one proxy session over real pipes and returns the host's and the
// upstream's ends: what each writes to the proxy, and a reader of what the proxy writes to
// it, plus Serve's result and the proxy's end of the pipe to upstream (Serve does not close
// it; closing it ends upR after what the proxy wrote).
func stdioSession(t *testing.T, logs *lockedBuffer) (hostW *os.File, hostR *bufio.Reader, upW *os.File, upR *bufio.Reader, served <-chan error, toUp *os.File) {
	t.Helper()
	l, err := badger.Open(filepath.Join(t.TempDir(), "store"), badger.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	ic, err := interceptor.New(l, interceptor.Options{})
	require.NoError(t, err)
	p, err := mcpproxy.New(ic, mcpproxy.Options{ServerID: "fx", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	pipe := func() (*os.File, *os.File) {
		r, w, err := os.Pipe()
		require.NoError(t, err)
		t.Cleanup(func() { r.Close(); w.Close() })
		return r, w
	}
	hostIn, hostW := pipe()
	hr, proxyOut := pipe()
	ur, proxyToUp := pipe()
	proxyFromUp, upW := pipe()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch := make(chan error, 1)
	go func() { ch <- p.Serve(ctx, mcpproxy.Stdio(hostIn, proxyOut), mcpproxy.Stdio(proxyFromUp, proxyToUp)) }()
	return hostW, bufio.NewReader(hr), upW, bufio.NewReader(ur), ch, proxyToUp
}

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

// TestProxyDropsLinesFromUpstreamThatAreNotJSONRPC: a stdio server that prints a banner or a
// log line on stdout does not end the session: the line is dropped with a warning naming it,
// and the answers after it reach the host.
func TestProxyDropsLinesFromUpstreamThatAreNotJSONRPC(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	hostW, hostR, upW, upR, served, _ := stdioSession(t, logs)

	_, err := hostW.WriteString(`{"jsonrpc":"2.0","id":7,"method":"ping"}` + "\n")
	require.NoError(t, err)
	require.JSONEq(t, `{"jsonrpc":"2.0","id":7,"method":"ping"}`, readLineWithin(t, upR))
	_, err = upW.WriteString("payments server v1.2 listening on stdio\n" + `{"jsonrpc":"2.0","id":7,"result":{}}` + "\n")
	require.NoError(t, err)
	require.JSONEq(t, `{"jsonrpc":"2.0","id":7,"result":{}}`, readLineWithin(t, hostR), "the answer after the stray line reaches the host")
	require.Contains(t, logs.String(), "upstream wrote a line that is not a JSON-RPC message")
	require.Contains(t, logs.String(), "payments server v1.2 listening on stdio")
	select {
	case err := <-served:
		t.Fatalf("the session ended: %v", err)
	default:
	}
}

// TestProxyEndsTheSessionOnALineFromTheHostThatIsNotJSONRPC: a host line that is not JSON-RPC
// ends the session (no id can be read from it to answer), with an error that says the host
// sent it and quotes it; nothing is relayed upstream.
func TestProxyEndsTheSessionOnALineFromTheHostThatIsNotJSONRPC(t *testing.T) {
	t.Parallel()
	hostW, _, _, upR, served, toUp := stdioSession(t, &lockedBuffer{})
	_, err := hostW.WriteString("hello proxy\n")
	require.NoError(t, err)
	select {
	case err := <-served:
		require.ErrorContains(t, err, `the host sent a line that is not a JSON-RPC message`)
		require.ErrorContains(t, err, `(line "hello proxy")`)
		require.NotErrorIs(t, err, mcpproxy.ErrUpstreamGone)
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not end")
	}
	require.NoError(t, toUp.Close()) // Serve has returned: the proxy writes nothing more
	rest, _ := io.ReadAll(upR)
	require.Empty(t, rest, "nothing reached upstream")
}
