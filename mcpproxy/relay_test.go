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
)

// TestProxyRelaysUpstreamLinesByteForByte: over stdio, what upstream writes reaches the host
// as upstream wrote it (spacing, key order, "<" and "&", escapes), for answers and
// notifications alike (re-encoding compacted it).
func TestProxyRelaysUpstreamLinesByteForByte(t *testing.T) {
	t.Parallel()
	l, err := badger.Open(filepath.Join(t.TempDir(), "store"), badger.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	ic, err := interceptor.New(l, interceptor.Options{})
	require.NoError(t, err)
	p, err := mcpproxy.New(ic, mcpproxy.Options{ServerID: "fx"})
	require.NoError(t, err)

	pipe := func() (*os.File, *os.File) {
		r, w, err := os.Pipe()
		require.NoError(t, err)
		t.Cleanup(func() { r.Close(); w.Close() })
		return r, w
	}
	hostIn, hostW := pipe()      // host → proxy
	hostR, proxyOut := pipe()    // proxy → host
	upIn, proxyToUp := pipe()    // proxy → upstream
	proxyFromUp, upOut := pipe() // upstream → proxy
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	served := make(chan error, 1)
	go func() {
		served <- p.Serve(ctx, mcpproxy.Stdio(hostIn, proxyOut), mcpproxy.Stdio(proxyFromUp, proxyToUp))
	}()
	host, up := bufio.NewReader(hostR), bufio.NewReader(upIn)
	readLine := func(r *bufio.Reader) string {
		line := make(chan string, 1)
		go func() { s, _ := r.ReadString('\n'); line <- s }()
		select {
		case s := <-line:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no line")
		}
		return ""
	}

	_, err = hostW.WriteString(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}` + "\n")
	require.NoError(t, err)
	require.JSONEq(t, `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`, readLine(up))

	answer := `{"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "charge", "description": "<b>charges</b> & more \u00e9", "inputSchema": {"type": "object"}}]}}` + "\n"
	note := `{ "method": "notifications/message", "jsonrpc": "2.0", "params": {"level": "info", "data": "a < b"} }` + "\n"
	_, err = upOut.WriteString(answer + note)
	require.NoError(t, err)
	require.Equal(t, answer, readLine(host))
	require.Equal(t, note, readLine(host))

	require.NoError(t, hostW.Close())
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not end when the host closed its side")
	}
}
