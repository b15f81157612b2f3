package mcpproxy_test

import (
	"bufio"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpproxy"
)

// TestProxyDropsLinesFromUpstreamThatAreNotJSONRPC: a stdio server that prints a banner or a
// log line on stdout does not end the session: the line is dropped with a warning naming it,
// and the answers after it reach the host.
func TestProxyDropsLinesFromUpstreamThatAreNotJSONRPC(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	ps := newPipeSession(t, interceptor.Options{}, mcpproxy.Options{ServerID: "fx", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	hostR, upR := bufio.NewReader(ps.hostR), bufio.NewReader(ps.upR)

	_, err := ps.hostW.WriteString(`{"jsonrpc":"2.0","id":7,"method":"ping"}` + "\n")
	require.NoError(t, err)
	require.JSONEq(t, `{"jsonrpc":"2.0","id":7,"method":"ping"}`, readLineWithin(t, upR))
	_, err = ps.upW.WriteString("payments server v1.2 listening on stdio\n" + `{"jsonrpc":"2.0","id":7,"result":{}}` + "\n")
	require.NoError(t, err)
	require.JSONEq(t, `{"jsonrpc":"2.0","id":7,"result":{}}`, readLineWithin(t, hostR), "the answer after the stray line reaches the host")
	require.Contains(t, logs.String(), "upstream wrote a line that is not a JSON-RPC message")
	require.Contains(t, logs.String(), "payments server v1.2 listening on stdio")
	select {
	case err := <-ps.served:
		t.Fatalf("the session ended: %v", err)
	default:
	}
}

// TestProxyEndsTheSessionOnALineFromTheHostThatIsNotJSONRPC: a host line that is not JSON-RPC
// ends the session (no id can be read from it to answer), with an error that says the host
// sent it and quotes it; nothing is relayed upstream.
func TestProxyEndsTheSessionOnALineFromTheHostThatIsNotJSONRPC(t *testing.T) {
	t.Parallel()
	ps := newPipeSession(t, interceptor.Options{}, mcpproxy.Options{ServerID: "fx"})
	_, err := ps.hostW.WriteString("hello proxy\n")
	require.NoError(t, err)
	select {
	case err := <-ps.served:
		require.ErrorContains(t, err, `the host sent a line that is not a JSON-RPC message`)
		require.ErrorContains(t, err, `(line "hello proxy")`)
		require.NotErrorIs(t, err, mcpproxy.ErrUpstreamGone)
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not end")
	}
	require.NoError(t, ps.toUp.Close()) // Serve has returned: the proxy writes nothing more
	rest, _ := io.ReadAll(ps.upR)
	require.Empty(t, rest, "nothing reached upstream")
}
