package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
)

func TestServeUsage(t *testing.T) {
	t.Parallel()
	store := filepath.Join(t.TempDir(), "store")
	fails(t, exitUsage, []string{"exactly one of --stdio or --http"}, "serve", "--store", store)
	fails(t, exitUsage, []string{"exactly one of --stdio or --http"}, "serve", "--stdio", "--http", "127.0.0.1:0", "--store", store)
	fails(t, exitUsage, []string{"non-loopback address without a bearer token"}, "serve", "--http", "0.0.0.0:7777", "--store", store)
	fails(t, exitUsage, []string{"must be positive"}, "serve", "--http", "127.0.0.1:0", "--max-conns", "0", "--store", store)
	fails(t, exitUsage, []string{"must be positive"}, "serve", "--http", "127.0.0.1:0", "--idle-timeout", "-1s", "--store", store)
	fails(t, exitUsage, []string{"must be positive"}, "serve", "--http", "127.0.0.1:0", "--max-sessions", "0", "--store", store)
	fails(t, exitUsage, []string{"--max-values must be positive"}, "serve", "--http", "127.0.0.1:0", "--max-values", "-3", "--store", store)
	fails(t, exitUsage, []string{"--page-size 5000 exceeds 1000"}, "serve", "--http", "127.0.0.1:0", "--page-size", "5000", "--store", store)
	fails(t, exitUsage, []string{"--token-file and --upstream-idempotent apply to --http only"}, "serve", "--stdio", "--token-file", "x", "--store", store)
	fails(t, exitUsage, []string{"--token-file and --upstream-idempotent apply to --http only"}, "serve", "--stdio", "--upstream-idempotent", "charge", "--store", store)
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("short\n"), 0o600))
	fails(t, exitUsage, []string{"token"}, "serve", "--http", "127.0.0.1:0", "--token-file", tokens, "--store", store)
	_, err := os.Stat(store)
	require.ErrorIs(t, err, os.ErrNotExist, "a refused serve does not create the store")
}

// serveToken is the MCP token of teamServe's server (namespace "team"); ledgerToken is its
// token granted the ledger protocol too (for --store http://…).
const (
	serveToken  = "serve-test-token-0123456789abcdef"
	ledgerToken = "ledger-test-token-0123456789abcdef"
)

// teamServe starts `toolfence serve --http` on a fresh store with serveToken and ledgerToken
// (namespace "team") and the extra flags (see serveProc).
func teamServe(t *testing.T, extra ...string) (*exec.Cmd, string, <-chan string) {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte(serveToken+" team\n"+ledgerToken+" team ledger\n"), 0o600))
	return serveProc(t, filepath.Join(dir, "store"), tokens, extra...)
}

// serveProc runs `toolfence serve --http 127.0.0.1:0` on store with the token file and the
// extra flags; it returns the process, the endpoint URL it reports and its later stderr
// lines. The server is killed when the test ends.
func serveProc(t *testing.T, store, tokens string, extra ...string) (*exec.Cmd, string, <-chan string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--http", "127.0.0.1:0", "--token-file", tokens, "--store", store}, extra...)...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := make(chan string, 1)
	lines := make(chan string, 64)
	go func() {
		re := regexp.MustCompile(`serving MCP at (http://\S+) `)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
				continue
			}
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	select {
	case url := <-addr:
		return cmd, url, lines
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not report its address")
		return nil, "", nil
	}
}

// TestServeHTTP runs `toolfence serve --http` with a token file, talks to it with the Go
// client, and stops it with SIGTERM.
func TestServeHTTP(t *testing.T) {
	t.Parallel()
	cmd, url, _ := teamServe(t, "--idle-timeout", "200ms")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := mcpserver.Dial(ctx, url, serveToken)
	require.NoError(t, err)
	var b mcpserver.BeginResult
	require.NoError(t, c.Call(ctx, "begin_call", map[string]any{"task": "t", "operation": "o", "target": "x", "args": map[string]any{}}, &b))
	require.Equal(t, mcpserver.DecisionProceed, b.Decision)
	page, err := c.List(ctx, mcpserver.ListPendingInput{})
	require.NoError(t, err)
	require.Len(t, page.Residuals, 1)
	v, err := c.Inspect(ctx, b.Key)
	require.NoError(t, err)
	require.Equal(t, "team", v.Namespace, "the token's namespace")
	require.NoError(t, c.Close())
	_, err = mcpserver.Dial(ctx, url, "wrong-token-0123456789abcdef")
	require.ErrorIs(t, err, ledger.ErrUnauthorized)

	// An unauthenticated keep-alive connection that idles is closed (--idle-timeout).
	conn, err := net.DialTimeout("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), mcpwire.Path), 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	_, _ = io.Copy(io.Discard, resp.Body)
	_, err = br.ReadByte()
	require.ErrorIs(t, err, io.EOF, "the idle connection was closed by serve")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "serve exits 0 on SIGTERM")
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop on SIGTERM")
	}
}

// TestServeRefusesReservationsWhenLowOnSpace: with less free space than --min-free-mib on
// the embedded store's filesystem, begin_call is unavailable (nothing dispatched) while
// reads work; the 1 PiB reserve makes any real disk "full".
func TestServeRefusesReservationsWhenLowOnSpace(t *testing.T) {
	t.Parallel()
	_, url, logged := teamServe(t, "--min-free-mib", "1073741824")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := mcpserver.Dial(ctx, url, serveToken)
	require.NoError(t, err)
	defer c.Close()
	var b mcpserver.BeginResult
	err = c.Call(ctx, "begin_call", map[string]any{"task": "t", "operation": "o", "target": "x", "args": map[string]any{}}, &b)
	var te *mcpserver.ToolError
	require.ErrorAs(t, err, &te)
	require.Equal(t, mcpwire.KindUnavailable, te.Info.Kind)
	require.Contains(t, te.Info.Recovery, "do NOT perform the call")
	page, err := c.List(ctx, mcpserver.ListPendingInput{})
	require.NoError(t, err, "reads still work")
	require.Empty(t, page.Residuals, "nothing was reserved")
	deadline := time.After(10 * time.Second)
	for {
		select {
		case line := <-logged:
			if strings.Contains(line, "low on free space") {
				return
			}
		case <-deadline:
			t.Fatal("serve did not log the low space")
		}
	}
}
