package mcpproxy_test

import (
	"bufio"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpproxy"
)

// TestProxyRelaysUpstreamLinesByteForByte: over stdio, what upstream writes reaches the host
// as upstream wrote it (spacing, key order, "<" and "&", escapes), for answers and
// notifications alike (re-encoding compacted it).
func TestProxyRelaysUpstreamLinesByteForByte(t *testing.T) {
	t.Parallel()
	ps := newPipeSession(t, interceptor.Options{}, mcpproxy.Options{ServerID: "fx"})
	host, up := bufio.NewReader(ps.hostR), bufio.NewReader(ps.upR)
	readLine := func(r *bufio.Reader) string { return readLineWithin(t, r) }

	_, err := ps.hostW.WriteString(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}` + "\n")
	require.NoError(t, err)
	require.JSONEq(t, `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`, readLine(up))

	answer := `{"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "charge", "description": "<b>charges</b> & more \u00e9", "inputSchema": {"type": "object"}}]}}` + "\n"
	note := `{ "method": "notifications/message", "jsonrpc": "2.0", "params": {"level": "info", "data": "a < b"} }` + "\n"
	_, err = ps.upW.WriteString(answer + note)
	require.NoError(t, err)
	require.Equal(t, answer, readLine(host))
	require.Equal(t, note, readLine(host))

	require.NoError(t, ps.hostW.Close())
	select {
	case err := <-ps.served:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not end when the host closed its side")
	}
}
