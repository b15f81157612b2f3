package transport

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"
)

// TestLineConnFraming: one message per line, blank lines skipped, a batch read as its
// messages in order, a line longer than the reader's buffer read whole, a last line without
// a newline read, then EOF; a bad line is an error.
func TestLineConnFraming(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 100<<10)
	in := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}` + "\n\n" +
		`[{"jsonrpc":"2.0","method":"a"},{"jsonrpc":"2.0","id":"s","result":{}}]` + "\n" +
		`{"jsonrpc":"2.0","method":"big","params":{"t":"` + big + `"}}` + "\n" +
		`{"jsonrpc":"2.0","method":"last"}`
	c := newLineConn(strings.NewReader(in), io.Discard, nil)
	ctx := context.Background()
	var got []string
	for {
		m, err := c.Read(ctx)
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		switch m := m.(type) {
		case *jsonrpc.Request:
			got = append(got, m.Method)
			if m.Method == "big" {
				require.Contains(t, string(m.Params), big)
			}
		case *jsonrpc.Response:
			got = append(got, "response "+m.ID.Raw().(string))
		}
	}
	require.Equal(t, []string{"tools/list", "a", "response s", "big", "last"}, got)

	bad := newLineConn(strings.NewReader("{not json}\n"), io.Discard, nil)
	_, err := bad.Read(ctx)
	require.Error(t, err)
}

// TestLineConnWriteAndClose: Write puts one message on one line; Close calls the closer
// once, a Read pending on the reader it closes ends with EOF (not the reader's "closed
// pipe"), and later Writes and Reads fail.
func TestLineConnWriteAndClose(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe()
	out, outW := io.Pipe()
	closed := 0
	c := newLineConn(pr, outW, func() error { closed++; return pr.Close() })
	go func() {
		id, _ := jsonrpc.MakeID(float64(7))
		_ = c.Write(context.Background(), &jsonrpc.Request{ID: id, Method: "ping"})
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.JSONEq(t, `{"jsonrpc":"2.0","id":7,"method":"ping"}`, strings.TrimSpace(line))

	requireCloseEndsRead(t, c)
	require.NoError(t, c.Close(), "a second Close is a no-op")
	require.Equal(t, 1, closed)
	require.Error(t, c.Write(context.Background(), &jsonrpc.Request{Method: "x"}))
	_, err = c.Read(context.Background())
	require.ErrorIs(t, err, io.EOF)
	_ = pw.Close()
}

// TestDecodeMessageMatchesTheSDK: the proxy's decoder gives the SDK's messages (requests,
// notifications, results, errors, string and number ids) and refuses what it refuses.
func TestDecodeMessageMatchesTheSDK(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":[1,2]}}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"r"}}`,
		`{"jsonrpc":"2.0","id":"s-1","result":{"content":[]}}`,
		`{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"nope","data":{"k":1}}}`,
		`{"jsonrpc":"2.0","id":3,"method":""}`,
	} {
		want, err := jsonrpc.DecodeMessage([]byte(in))
		require.NoError(t, err, in)
		got, err := decodeMessage([]byte(in))
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{
		`{"jsonrpc":"1.0","id":1,"method":"x"}`,
		`{"jsonrpc":"2.0","result":{}}`,
		`{"jsonrpc":"2.0","id":true,"method":"x"}`,
		`[1,2]`,
	} {
		_, sdkErr := jsonrpc.DecodeMessage([]byte(in))
		require.Error(t, sdkErr, in)
		_, err := decodeMessage([]byte(in))
		require.Error(t, err, in)
	}
}

// requireCloseEndsRead asserts that Close ends a Read pending on c with io.EOF.
func requireCloseEndsRead(t *testing.T, c *lineConn) {
	t.Helper()
	read := make(chan error, 1)
	go func() { _, err := c.Read(context.Background()); read <- err }()
	require.NoError(t, c.Close())
	select {
	case err := <-read:
		require.ErrorIs(t, err, io.EOF)
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the pending Read")
	}
}
