//lint:file-ignore SA1019 these tests cover the legacy protocol paths (logging, GET streams, subscribe) on purpose

package mcpserver_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
)

// listen runs e.srv.ListenAndServe on 127.0.0.1 until the test ends and returns its address.
func (e *env) listen() string {
	e.t.Helper()
	sctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- e.srv.ListenAndServe(sctx, "127.0.0.1:0", func(a net.Addr) { addrs <- a }) }()
	var addr net.Addr
	select {
	case addr = <-addrs:
	case err := <-done:
		e.t.Fatalf("ListenAndServe: %v", err)
	}
	e.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(e.t, err)
		case <-time.After(10 * time.Second):
			e.t.Error("ListenAndServe did not return")
		}
	})
	return addr.String()
}

// unauthenticated sends one keep-alive request without a token on c and reads its 401,
// or returns the read error (a timeout when nobody answers within wait).
func unauthenticated(c net.Conn, wait time.Duration) error {
	if _, err := io.WriteString(c, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusUnauthorized {
		return errors.New(resp.Status)
	}
	return nil
}

// TestHTTPIdleConnectionsClosed: keep-alive connections that read their 401 and then idle
// are closed by the server, so they cannot pile up (they used to stay open for good).
func TestHTTPIdleConnectionsClosed(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *mcpserver.Options) { o.IdleTimeout = 100 * time.Millisecond })
	addr := e.listen()
	const conns = 50
	cs := make([]net.Conn, conns)
	for i := range cs {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		require.NoError(t, unauthenticated(c, 5*time.Second))
		cs[i] = c
	}
	for i, c := range cs {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF, "idle connection %d was not closed", i)
	}
}

// TestHTTPConnectionCap: past MaxConns, a connection waits for a slot instead of being
// served, and a notification stream opened before keeps working.
func TestHTTPConnectionCap(t *testing.T) {
	t.Parallel()
	const max = 4
	e := setup(t, func(o *mcpserver.Options) { o.MaxConns = max })
	addr := e.listen()
	held := make([]net.Conn, max)
	for i := range held {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		require.NoError(t, unauthenticated(c, 5*time.Second), "connection %d is within the cap", i)
		held[i] = c
	}
	extra, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer extra.Close()
	err = unauthenticated(extra, 300*time.Millisecond)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "a connection over the cap was served: %v", err)
	require.NoError(t, held[0].Close())
	_ = extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(extra), nil)
	require.NoError(t, err, "served once a slot freed")
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// TestHTTPStreamOutlivesTimeouts: a session's notification stream keeps delivering long
// after the read and idle timeouts.
func TestHTTPStreamOutlivesTimeouts(t *testing.T) {
	t.Parallel()
	const timeout = 100 * time.Millisecond
	e := setup(t, func(o *mcpserver.Options) {
		o.IdleTimeout, o.ReadTimeout, o.ReadHeaderTimeout = timeout, timeout, timeout
	})
	addr := e.listen()
	sub := e.dialURL("http://"+addr+mcpwire.Path, tokA, legacy, transport.WithContinuousListening())
	n := collect(sub)
	// The stream must survive several timeouts before the change it reports.
	<-time.After(5 * timeout)
	agent := e.dialURL("http://"+addr+mcpwire.Path, tokA, legacy)
	ok[mcpserver.BeginResult](t, agent, mcpserver.ToolBegin, map[string]any{
		"task": "t", "operation": "op", "target": strings.Repeat("x", 3), "args": map[string]any{},
	})
	n.await(t, "notifications/resources/list_changed", "")
}
