package mcpproxy

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpproxy/transport"
)

func newTestProxy(t *testing.T) *Proxy {
	t.Helper()
	l, err := badger.Open(filepath.Join(t.TempDir(), "store"), badger.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	ic, err := interceptor.New(l, interceptor.Options{})
	require.NoError(t, err)
	p, err := New(ic, Options{ServerID: "fx"})
	require.NoError(t, err)
	return p
}

func osPipe(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

func awaitServe(t *testing.T, served <-chan error) error {
	t.Helper()
	select {
	case err := <-served:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	return nil
}

// waitReading waits until a goroutine is blocked in Read of each of conns (found by the
// receiver in the goroutines' stacks), so that a test acts on a pending Read.
func waitReading(t *testing.T, conns ...mcp.Connection) {
	t.Helper()
	require.Eventually(t, func() bool {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		for _, c := range conns {
			if !strings.Contains(stacks, fmt.Sprintf("(*lineConn).Read(%p", c)) {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond)
}

// TestServeEndsWhenItsContextEnds: with host and upstream both silent, cancelling Serve's
// context (what SIGINT and SIGTERM do to toolfence proxy) ends it with the context's error:
// over pipes read through the poller (the reads are interrupted) and over a reader nothing
// can interrupt (Serve returns without it).
func TestServeEndsWhenItsContextEnds(t *testing.T) {
	t.Parallel()
	t.Run("pipes", func(t *testing.T) {
		t.Parallel()
		p := newTestProxy(t)
		hostIn, _ := osPipe(t)
		_, proxyOut := osPipe(t)
		upIn, proxyToUp := osPipe(t)
		proxyFromUp, _ := osPipe(t)
		_ = upIn
		ctx, cancel := context.WithCancel(context.Background())
		down, up := transport.Stdio(hostIn, proxyOut), transport.Stdio(proxyFromUp, proxyToUp)
		served := make(chan error, 1)
		go func() { served <- p.Serve(ctx, down, up) }()
		waitReading(t, down) // the upstream is read once the host's first message came (link.go)
		cancel()
		require.ErrorIs(t, awaitServe(t, served), context.Canceled)
	})
	t.Run("uninterruptible host reader", func(t *testing.T) {
		t.Parallel()
		p := newTestProxy(t)
		hostIn, _ := io.Pipe() // no deadline: its Read stays blocked
		proxyFromUp, _ := osPipe(t)
		_, proxyToUp := osPipe(t)
		ctx, cancel := context.WithCancel(context.Background())
		down, up := transport.Stdio(hostIn, io.Discard), transport.Stdio(proxyFromUp, proxyToUp)
		served := make(chan error, 1)
		go func() { served <- p.Serve(ctx, down, up) }()
		waitReading(t, down)
		cancel()
		require.ErrorIs(t, awaitServe(t, served), context.Canceled)
	})
}

// TestListToolsHonoursItsContext: proxy lock and check give ListTools a deadline; an
// upstream that never answers initialize must not hold it past that.
func TestListToolsHonoursItsContext(t *testing.T) {
	t.Parallel()
	up, err := transport.StartUpstream(context.Background(), []string{"sleep", "60"}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = up.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := ListTools(ctx, up.Conn()); done <- err }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(10 * time.Second):
		t.Fatal("ListTools still blocked after its context ended")
	}
}

// chanConn is an in-memory mcp.Connection whose reads a test can hold at the n-th message.
type chanConn struct {
	in     chan jsonrpc.Message
	end    chan struct{} // closed: Read returns io.EOF
	before func(n int)   // runs before the n-th message is returned
	n      int
	write  func(jsonrpc.Message)
	closed chan struct{}
	once   sync.Once
}

func newChanConn() *chanConn {
	return &chanConn{in: make(chan jsonrpc.Message, 100), end: make(chan struct{}), closed: make(chan struct{})}
}

func (c *chanConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case m := <-c.in:
		c.n++
		if c.before != nil {
			c.before(c.n)
		}
		return m, nil
	case <-c.end:
		return nil, io.EOF
	case <-c.closed:
		return nil, io.EOF
	}
}

func (c *chanConn) Write(_ context.Context, m jsonrpc.Message) error {
	if c.write != nil {
		c.write(m)
	}
	return nil
}

func (c *chanConn) Close() error      { c.once.Do(func() { close(c.closed) }); return nil }
func (c *chanConn) SessionID() string { return "" }

// TestServeEndingWhileACallIsRead: the upstream ends just as the host's next tools/call is
// read (relayed inline, the tool list being cached); Serve ends without a panic, and the
// call is either relayed before it ends or not started (it used to write into the relay
// table Serve had dropped, and to count a call while Serve waited for the count to reach 0).
func TestServeEndingWhileACallIsRead(t *testing.T) {
	t.Parallel()
	p := newTestProxy(t)
	call := func(id int) jsonrpc.Message {
		rid, _ := jsonrpc.MakeID(float64(id))
		return &jsonrpc.Request{ID: rid, Method: "tools/call", Params: []byte(`{"name":"read","arguments":{}}`)}
	}
	for i := range 1000 {
		down, up := newChanConn(), newChanConn()
		relayed := make(chan struct{})
		var once sync.Once
		up.write = func(m jsonrpc.Message) {
			r, ok := m.(*jsonrpc.Request)
			switch {
			case ok && r.Method == "tools/list":
				up.in <- &jsonrpc.Response{ID: r.ID, Result: []byte(`{"tools":[{"name":"read","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]}`)}
			case ok && r.Method == "tools/call":
				once.Do(func() { close(relayed) })
			}
		}
		spin := i % 200
		down.before = func(n int) {
			if n == 2 {
				<-relayed     // call 1 went through call(): the tool list is cached
				close(up.end) // the upstream ends as call 2 is read
				for j := range spin {
					_ = j * j
				}
			}
		}
		down.in <- call(1)
		down.in <- call(2)
		served := make(chan error, 1)
		go func() { served <- p.Serve(context.Background(), down, up) }()
		require.ErrorIs(t, awaitServe(t, served), ErrUpstreamGone)
	}
}
