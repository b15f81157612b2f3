package httpserve_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/httpserve"
)

// TestSlowlorisFromOnePeer: 3,000 connections from one peer address (127.0.0.2) that open
// and send nothing cannot keep another client (127.0.0.1) from being served: past
// MaxConnsPerPeer the peer's connections are closed as they are accepted, so the MaxConns
// slots stay free for others. Without the per-peer cap the first 1,024 slow connections
// hold every slot and the other client waits for the header timeout.
func TestSlowlorisFromOnePeer(t *testing.T) {
	limits := httpserve.Limits{ReadHeaderTimeout: 20 * time.Second, ReadTimeout: 30 * time.Second}
	srv := limits.Server(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(limits.Listener(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := ln.Addr().String()

	slow := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
	const attackers = 3000
	conns := make([]net.Conn, 0, attackers)
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	for range attackers {
		c, err := slow.Dial("tcp", addr)
		if err != nil {
			break // the kernel's accept queue is full: the peer is held back already
		}
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\n") // a request that never ends its headers
		conns = append(conns, c)
	}
	require.NotEmpty(t, conns)

	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var took []time.Duration
	for i := range 50 {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+addr+"/", nil)
		require.NoError(t, err)
		start := time.Now()
		resp, err := hc.Do(req)
		require.NoError(t, err, "request %d of another client while %d slow connections are open", i, len(conns))
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, "ok", string(body))
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	t.Logf("%d slow connections from 127.0.0.2; another client's 50 requests: median %v, p99 %v",
		len(conns), took[len(took)/2], took[len(took)*99/100])
}
