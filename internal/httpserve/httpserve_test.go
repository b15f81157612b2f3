package httpserve_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolfence/toolfence/internal/httpserve"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve runs h under l on a loopback listener until the test ends and returns its address.
func serve(t *testing.T, l httpserve.Limits, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := l.Server(h)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l.Listener(ln)) }()
	t.Cleanup(func() {
		require.NoError(t, srv.Close())
		require.ErrorIs(t, <-done, http.ErrServerClosed)
	})
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// get sends one keep-alive GET on c and returns the status line, or an error when no answer
// came within wait.
func get(c net.Conn, wait time.Duration) (string, error) {
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Status, nil
}

var hello = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "hello") })

// TestIdleConnectionsAreClosed: a keep-alive connection that got its answer and then sends
// nothing is closed by the server (it used to be held open forever).
func TestIdleConnectionsAreClosed(t *testing.T) {
	t.Parallel()
	addr := serve(t, httpserve.Limits{IdleTimeout: 100 * time.Millisecond}, hello)
	const conns = 20
	cs := make([]net.Conn, conns)
	br := make([]*bufio.Reader, conns)
	for i := range cs {
		cs[i] = dial(t, addr)
		st, err := get(cs[i], 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, "200 OK", st)
		br[i] = bufio.NewReader(cs[i])
	}
	for i, c := range cs {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := br[i].ReadByte()
		require.ErrorIs(t, err, io.EOF, "connection %d was not closed by the server", i)
	}
}

// TestConnectionCap: with MaxConns open connections, the next one is not served until one
// of them closes.
func TestConnectionCap(t *testing.T) {
	t.Parallel()
	const max = 4
	addr := serve(t, httpserve.Limits{MaxConns: max}, hello)
	held := make([]net.Conn, max)
	for i := range held {
		held[i] = dial(t, addr)
		st, err := get(held[i], 5*time.Second)
		require.NoError(t, err, "connection %d within the cap", i)
		require.Equal(t, "200 OK", st)
	}
	extra := dial(t, addr) // the kernel accepts it; the server does not, yet
	_, err := get(extra, 300*time.Millisecond)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "connection over the cap was served: %v", err)
	require.NoError(t, held[0].Close())
	_ = extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(extra), nil)
	require.NoError(t, err, "served once a slot freed")
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestStreamsOutliveTimeouts: a response stream (SSE) keeps going long after the read and
// idle timeouts, for requests with and without a body.
func TestStreamsOutliveTimeouts(t *testing.T) {
	t.Parallel()
	const timeout = 100 * time.Millisecond
	stream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		tick := time.NewTicker(timeout / 2)
		defer tick.Stop()
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				fmt.Fprintln(os.Stderr, "stream context ended:", context.Cause(r.Context()))
				return
			case <-tick.C:
			}
		}
	})
	addr := serve(t, httpserve.Limits{ReadTimeout: timeout, ReadHeaderTimeout: timeout, IdleTimeout: timeout}, stream)
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), method, "http://"+addr, strings.NewReader("{}"))
			require.NoError(t, err)
			if method == http.MethodGet {
				req.Body, req.ContentLength = http.NoBody, 0
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			start := time.Now()
			events := 0
			for time.Since(start) < 8*timeout && sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data: ") {
					events++
				}
			}
			require.NoError(t, sc.Err())
			require.GreaterOrEqual(t, time.Since(start), 8*timeout, "stream ended after %d events", events)
		})
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, httpserve.Limits{}.Validate())
	for _, l := range []httpserve.Limits{
		{MaxConns: -1}, {IdleTimeout: -1}, {ReadTimeout: -1}, {ReadHeaderTimeout: -1},
		{ReadHeaderTimeout: time.Minute, ReadTimeout: time.Second},
	} {
		require.ErrorIs(t, l.Validate(), httpserve.ErrInvalid, "%+v", l)
	}
}
