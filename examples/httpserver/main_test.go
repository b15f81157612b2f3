package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/httpguard"
)

// server runs the example's run() on a real listener with a fresh store and returns its
// base URL; the server is shut down (and run's error checked) at cleanup.
func server(t *testing.T, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-addr", "127.0.0.1:0", "-store", t.TempDir(), "-tokens", "tok-a=agent-a,tok-b=agent-b"}, extra...), pw)
		_ = pw.Close()
	}()
	lines := bufio.NewScanner(pr)
	require.True(t, lines.Scan(), "server did not start")
	url, ok := strings.CutPrefix(lines.Text(), "listening on ")
	require.True(t, ok, lines.Text())
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("server did not shut down")
		}
	})
	return url
}

type answer struct {
	status int
	header http.Header
	body   string
}

// call sends one request. It may run on goroutines other than the test's, so it reports
// failures with Errorf and returns status 0.
func call(t *testing.T, method, url, token, key, body string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Errorf("new request: %v", err)
		return answer{}
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, url, err)
		return answer{}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Errorf("read body: %v", err)
	}
	return answer{res.StatusCode, res.Header, string(b)}
}

func stats(t *testing.T, base string) map[string]int {
	t.Helper()
	var s map[string]int
	require.NoError(t, json.Unmarshal([]byte(call(t, "GET", base+"/stats", "", "", "").body), &s))
	return s
}

func TestToolServer(t *testing.T) {
	t.Parallel()
	base := server(t)
	const k1, k2 = `"ticket-7b1c0d5e"`, `"deploy-0c2a1b3e"`

	// Missing key and unknown callers are refused before anything happens.
	require.Equal(t, http.StatusBadRequest, call(t, "POST", base+"/tools/create_ticket", "tok-a", "", `{"title":"disk full"}`).status)
	require.Equal(t, http.StatusUnauthorized, call(t, "POST", base+"/tools/create_ticket", "nope", k1, `{"title":"disk full"}`).status)

	// A retried tool call replays the first answer.
	first := call(t, "POST", base+"/tools/create_ticket", "tok-a", k1, `{"title":"disk full"}`)
	require.Equal(t, http.StatusCreated, first.status)
	again := call(t, "POST", base+"/tools/create_ticket", "tok-a", k1, `{"title": "disk full"}`)
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, first.body, again.body)
	require.Equal(t, "true", again.header.Get(httpguard.ReplayHeader))
	require.Equal(t, "/tickets/1", again.header.Get("Location"))
	// The same key with other arguments is refused; another principal has its own keys.
	require.Equal(t, http.StatusUnprocessableEntity, call(t, "POST", base+"/tools/create_ticket", "tok-a", k1, `{"title":"disk very full"}`).status)
	require.Equal(t, http.StatusCreated, call(t, "POST", base+"/tools/create_ticket", "tok-b", k1, `{"title":"disk full"}`).status)

	// An accepted deploy is replayed as the same 202 and status URL.
	d1 := call(t, "POST", base+"/tools/deploy", "tok-a", k2, `{"service":"api","version":"1.4.2"}`)
	d2 := call(t, "POST", base+"/tools/deploy", "tok-a", k2, `{"service":"api","version":"1.4.2"}`)
	require.Equal(t, http.StatusAccepted, d1.status)
	require.Equal(t, http.StatusAccepted, d2.status)
	require.Equal(t, d1.header.Get("Location"), d2.header.Get("Location"))
	require.Equal(t, d1.body, d2.body)
	require.Equal(t, http.StatusOK, call(t, "GET", base+d1.header.Get("Location"), "", "", "").status)

	// Twenty agents retrying the same email at once send it once.
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			a := call(t, "POST", base+"/tools/send_email", "tok-a", `"email-1"`, `{"to":"bob@example.com","subject":"invoice"}`)
			if a.status != http.StatusOK && a.status != http.StatusConflict {
				t.Errorf("send_email: %d %s", a.status, a.body)
			}
		})
	}
	wg.Wait()

	require.Equal(t, map[string]int{"tickets": 2, "emails": 1, "deploys": 1}, stats(t, base))
}

func TestParseTokens(t *testing.T) {
	t.Parallel()
	m, err := parseTokens("a=x, b=y")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"a": "x", "b": "y"}, m)
	_, err = parseTokens("a")
	require.Error(t, err)
}

// TestIdleConnectionsClosed: keep-alive connections that got their answer and idle are
// closed by the server (-idle-timeout), so they cannot exhaust its file descriptors.
func TestIdleConnectionsClosed(t *testing.T) {
	t.Parallel()
	url := server(t, "-idle-timeout", "100ms")
	for i := range 20 {
		conn, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), 5*time.Second)
		require.NoError(t, err)
		defer conn.Close()
		_, err = io.WriteString(conn, "GET /stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		require.NoError(t, err)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		_, err = br.ReadByte()
		require.ErrorIs(t, err, io.EOF, "idle connection %d was closed", i)
	}
}

func TestLimitFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-max-conns", "0"}, {"-idle-timeout", "-1s"}, {"-header-timeout", "1m", "-read-timeout", "1s"}} {
		err := run(t.Context(), append([]string{"-addr", "127.0.0.1:0", "-store", t.TempDir()}, args...), io.Discard)
		require.Error(t, err, "%v", args)
	}
}
