package transport

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// nonblocking reads the O_NONBLOCK flag of f's open file (without f.Fd, which would set
// blocking mode).
func nonblocking(t *testing.T, f *os.File) bool {
	t.Helper()
	rc, err := f.SyscallConn()
	require.NoError(t, err)
	var flags int
	var ferr error
	require.NoError(t, rc.Control(func(fd uintptr) { flags, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0) }))
	require.NoError(t, ferr)
	return flags&unix.O_NONBLOCK != 0
}

// TestStdioPollsPipes: over pipes, Stdio reads and writes through non-blocking duplicates
// (the runtime's poller), relays messages both ways, ends a pending Read with EOF on Close,
// and leaves the host's pipes open and in blocking mode again.
func TestStdioPollsPipes(t *testing.T) {
	t.Parallel()
	inR, inW, err := os.Pipe()
	require.NoError(t, err)
	outR, outW, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { inR.Close(); inW.Close(); outR.Close(); outW.Close() })
	// A host gives its child blocking pipes; Go's own are non-blocking until Fd is called.
	inR.Fd()
	outW.Fd()
	require.False(t, nonblocking(t, inR))

	c := Stdio(inR, outW)
	lc := c.(*lineConn)
	_, polled := lc.w.(*os.File)
	require.True(t, polled && lc.w != io.Writer(outW), "the writer is a duplicate of the pipe")
	require.True(t, nonblocking(t, inR), "the pipe's open file is in non-blocking mode while the connection is open")

	_, err = inW.WriteString(`{"jsonrpc":"2.0","id":1,"method":"ping"}` + "\n")
	require.NoError(t, err)
	msg, err := c.Read(context.Background())
	require.NoError(t, err)
	require.Equal(t, "ping", msg.(*jsonrpc.Request).Method)
	id, _ := jsonrpc.MakeID(float64(1))
	require.NoError(t, c.Write(context.Background(), &jsonrpc.Response{ID: id, Result: []byte(`{}`)}))
	line, err := bufio.NewReader(outR).ReadString('\n')
	require.NoError(t, err)
	require.JSONEq(t, `{"jsonrpc":"2.0","id":1,"result":{}}`, strings.TrimSpace(line))

	requireCloseEndsRead(t, lc)
	require.False(t, nonblocking(t, inR), "blocking mode restored")
	require.False(t, nonblocking(t, outW), "blocking mode restored")

	// The host's pipes are still open.
	_, err = inW.WriteString("after\n")
	require.NoError(t, err)
	after, err := bufio.NewReader(inR).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "after\n", after)
}

// TestStdioLeavesFilesAlone: a regular file (a redirected stdin) is read as it is: no
// duplicate, no change of mode.
func TestStdioLeavesFilesAlone(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "in")
	require.NoError(t, os.WriteFile(path, []byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`+"\n"), 0o600))
	f, err := os.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	c := Stdio(f, io.Discard)
	require.Nil(t, c.(*lineConn).closer)
	msg, err := c.Read(context.Background())
	require.NoError(t, err)
	require.Equal(t, "ping", msg.(*jsonrpc.Request).Method)
	_, err = c.Read(context.Background())
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, c.Close())
	require.False(t, nonblocking(t, f))
}

// TestStdioLeavesANonBlockingFileAsItIs: a pipe Go already polls (os.Pipe's, or a stdin
// handed over non-blocking) is used as it is: no duplicate, and it is still non-blocking
// and polled after Close.
func TestStdioLeavesANonBlockingFileAsItIs(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { r.Close(); w.Close() })
	require.True(t, nonblocking(t, r))
	c := Stdio(r, w)
	lc := c.(*lineConn)
	require.Nil(t, lc.closer, "no duplicate to close")
	require.Equal(t, io.Writer(w), lc.w)
	require.NoError(t, c.Close())
	require.True(t, nonblocking(t, r))
	require.True(t, nonblocking(t, w))
	require.NoError(t, r.SetReadDeadline(time.Now()), "still read through the poller")
}
