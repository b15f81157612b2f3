package main

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// stdioServe is one `toolfence serve --stdio` process and an MCP client (the official Go
// SDK) connected to it.
type stdioServe struct {
	cmd *exec.Cmd
	s   *mcp.ClientSession
}

// startStdioServe starts `toolfence serve --stdio --store store` and connects to it.
func startStdioServe(t *testing.T, store string) *stdioServe {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--stdio", "--store", store)
	cmd.Stderr = os.Stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil)
	s, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return &stdioServe{cmd: cmd, s: s}
}

// call calls a tool and decodes its structured result into out; a tool error fails t.
func (p *stdioServe) call(t *testing.T, tool string, args map[string]any, out any) {
	t.Helper()
	res, err := p.s.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: args})
	require.NoError(t, err)
	raw, err := json.Marshal(res.StructuredContent)
	require.NoError(t, err)
	require.False(t, res.IsError, "%s: %s", tool, raw)
	require.NoError(t, json.Unmarshal(raw, out), "%s: %s", tool, raw)
}

// charge runs begin_call and commit_call (succeeded) for target and returns the key.
func (p *stdioServe) charge(t *testing.T, target string) string {
	t.Helper()
	var b mcpserver.BeginResult
	p.call(t, "begin_call", map[string]any{"task": "run-1", "operation": "charge", "target": target, "args": map[string]any{"amount": 5}}, &b)
	require.Equal(t, mcpserver.DecisionProceed, b.Decision)
	var c mcpserver.CommitResult
	p.call(t, "commit_call", map[string]any{"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "outcome": "succeeded", "result": map[string]any{"id": target}}, &c)
	require.Equal(t, residual.Succeeded, c.State)
	return b.Key
}

// inspect returns the residual of key as the server sees it.
func (p *stdioServe) inspect(t *testing.T, key string) mcpserver.ResidualView {
	t.Helper()
	var v mcpserver.ResidualView
	p.call(t, "inspect_residual", map[string]any{"key": key}, &v)
	return v
}

// sharedStore returns a new store directory with a short path.
func sharedStore(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tfshared")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "store")
}

// TestTwoServeStdioShareOneStore: two hosts each start `toolfence serve --stdio` on the same
// badger store; both serve, and what one records the other sees (and replays).
func TestTwoServeStdioShareOneStore(t *testing.T) {
	t.Parallel()
	store := sharedStore(t)
	a := startStdioServe(t, store)
	b := startStdioServe(t, store)

	key := a.charge(t, "invoice:1")
	require.Equal(t, residual.Succeeded, b.inspect(t, key).State, "b sees a's commit")
	var again mcpserver.BeginResult
	b.call(t, "begin_call", map[string]any{"task": "run-1", "operation": "charge", "target": "invoice:1", "args": map[string]any{"amount": 5}}, &again)
	require.Equal(t, mcpserver.DecisionReplay, again.Decision, "the same call through b replays")

	key2 := b.charge(t, "invoice:2")
	require.Equal(t, residual.Succeeded, a.inspect(t, key2).State, "a sees b's commit")
}

// TestCommandsWhileAnotherProcessOwnsTheStore: ls, show, resolve and gc work on a store a
// running serve holds.
func TestCommandsWhileAnotherProcessOwnsTheStore(t *testing.T) {
	t.Parallel()
	store := sharedStore(t)
	owner := startStdioServe(t, store)
	settled := owner.charge(t, "invoice:1")
	var b mcpserver.BeginResult
	owner.call(t, "begin_call", map[string]any{"task": "run-1", "operation": "charge", "target": "invoice:2", "args": map[string]any{}}, &b)
	require.Equal(t, mcpserver.DecisionProceed, b.Decision)
	var c mcpserver.CommitResult
	owner.call(t, "commit_call", map[string]any{"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "outcome": "unknown"}, &c)
	unknown := b.Key

	rs := jsonLines(t, ok(t, "ls", "--store", store, "--json").stdout)
	require.Len(t, rs, 2)
	require.Contains(t, ok(t, "show", settled, "--store", store).stdout, "state           succeeded")
	r := ok(t, "resolve", unknown, "--as", "failed", "--note", "not charged", "--store", store)
	require.Contains(t, r.stdout, "resolved "+unknown+": unknown → failed")
	require.Equal(t, residual.Failed, owner.inspect(t, unknown).State, "the owner sees the resolution")
	r = ok(t, "gc", "--store", store, "--older-than", "0s")
	require.Contains(t, r.stdout, "deleted 2 settled residual(s) in namespace default")
	require.Empty(t, jsonLines(t, ok(t, "ls", "--store", store, "--json").stdout))

	fi, err := os.Stat(filepath.Join(store, ownerSocket))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "only the store's user may connect")
}

// TestOwnerKilledTheOtherTakesOver: the serve that owns the store is SIGKILLed; the other
// serve keeps serving (it takes the store over), nothing recorded is lost, and a later
// command reaches the new owner.
func TestOwnerKilledTheOtherTakesOver(t *testing.T) {
	t.Parallel()
	store := sharedStore(t)
	a := startStdioServe(t, store)
	b := startStdioServe(t, store)
	k1 := a.charge(t, "invoice:1")
	k2 := b.charge(t, "invoice:2")

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	_, _ = a.cmd.Process.Wait()

	for _, k := range []string{k1, k2} {
		v := b.inspect(t, k)
		require.Equal(t, residual.Succeeded, v.State, "recorded before the kill: %s", k)
	}
	k3 := b.charge(t, "invoice:3")
	rs := jsonLines(t, ok(t, "ls", "--store", store, "--json").stdout)
	keys := map[string]bool{}
	for _, r := range rs {
		keys[r.Key] = true
	}
	require.Equal(t, map[string]bool{k1: true, k2: true, k3: true}, keys, "ls (a third process) goes through the new owner")
}

// TestLockedStoreWithoutOwner: a store held by a program that does not share it (badger
// opened directly) fails after $TOOLFENCE_STORE_WAIT with a message that says so; demo,
// which needs the store alone, says that.
func TestLockedStoreWithoutOwner(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := badger.Open(dir, badger.Options{})
	require.NoError(t, err)
	defer l.Close()
	msg := "store " + dir + " is in use by another process that does not share it: nothing answered on " +
		filepath.Join(dir, ownerSocket) + " within 200ms"
	key := residual.Key("default", "t", "o", "x")
	for _, args := range [][]string{{"ls"}, {"show", key}, {"resolve", key, "--as", "failed", "--note", "x"}, {"gc"}} {
		r := tf(t, []string{storeWaitEnv + "=200ms"}, append(args, "--store", dir)...)
		require.Equal(t, exitError, r.code, "%v: %s", args, r)
		require.Contains(t, r.stderr, msg, "%v", args)
		require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %s", r.stderr)
	}
	fails(t, 1, []string{"store " + dir + " is in use by another process, and this command needs it alone"}, "demo", "--store", dir)
	r := tf(t, []string{storeWaitEnv + "=soon"}, "ls", "--store", dir)
	require.Equal(t, exitUsage, r.code, "%s", r)
	require.Contains(t, r.stderr, "$"+storeWaitEnv+`="soon": want a positive Go duration`)
}

// TestStoreHTTP: --store http://… reaches the ledger of a running `toolfence serve --http`
// with a bearer token bound to a namespace: ls, show, resolve and gc work; another namespace,
// a wrong token and no token are clear errors.
func TestStoreHTTP(t *testing.T) {
	t.Parallel()
	_, url, _ := teamServe(t)
	base := strings.TrimSuffix(url, mcpwire.Path)
	mcpc, err := mcpserver.Dial(t.Context(), url, serveToken)
	require.NoError(t, err)
	defer mcpc.Close()
	var b mcpserver.BeginResult
	require.NoError(t, mcpc.Call(t.Context(), "begin_call", map[string]any{"task": "t", "operation": "charge", "target": "invoice:1", "args": map[string]any{}}, &b))
	require.Equal(t, mcpserver.DecisionProceed, b.Decision)
	var c mcpserver.CommitResult
	require.NoError(t, mcpc.Call(t.Context(), "commit_call", map[string]any{"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "outcome": "unknown"}, &c))

	st := func(args ...string) []string {
		return append(args, "--store", base, "--token", ledgerToken, "--namespace", "team")
	}
	rs := jsonLines(t, ok(t, st("ls", "--json")...).stdout)
	require.Len(t, rs, 1)
	require.Equal(t, b.Key, rs[0].Key)
	require.Equal(t, residual.Unknown, rs[0].State)
	require.Contains(t, ok(t, st("show", b.Key[:12])...).stdout, "state           unknown")
	r := ok(t, st("resolve", b.Key, "--as", "succeeded", "--note", "found it", "--result", `{"id":"ch_1"}`)...)
	require.Contains(t, r.stdout, "resolved "+b.Key+": unknown → succeeded")
	v, err := mcpc.Inspect(t.Context(), b.Key)
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, v.State, "the server's MCP side sees the resolution")
	r = ok(t, st("gc", "--older-than", "0s")...)
	require.Contains(t, r.stdout, "deleted 1 settled residual(s) in namespace team")

	// The token from a file or the environment.
	tokFile := filepath.Join(t.TempDir(), "tok")
	require.NoError(t, os.WriteFile(tokFile, []byte(ledgerToken+"\n"), 0o600))
	ok(t, "ls", "--store", base, "--token-file", tokFile, "--namespace", "team")
	r = tf(t, []string{tokenEnv + "=" + ledgerToken}, "ls", "--store", base, "--namespace", "team")
	require.Equal(t, 0, r.code, "%s", r)

	fails(t, 1, []string{`server ` + base + ` refused namespace "default" (403)`, `bound to namespace "team"`, "--namespace"},
		"ls", "--store", base, "--token", ledgerToken)
	fails(t, 1, []string{"server " + base + " serves this bearer token MCP only (403)", "TOKEN NAMESPACE ledger"},
		"ls", "--store", base, "--token", serveToken, "--namespace", "team")
	fails(t, 1, []string{"server " + base + " refused the bearer token (401 Unauthorized)"},
		"ls", "--store", base, "--token", "wrong-token-0123456789abcdef", "--namespace", "team")
	fails(t, 1, []string{"server " + base + " refused the request (401 Unauthorized): it needs a bearer token"},
		"gc", "--store", base, "--namespace", "team")
	fails(t, 1, []string{"cannot reach the toolfence server at http://127.0.0.1:1"}, "ls", "--store", "http://127.0.0.1:1", "--token", serveToken)
	fails(t, 2, []string{"demo runs its story in a badger directory or a PostgreSQL database"}, "demo", "--store", base)
}

// TestServeStdioOnStoreHTTP: a serve --stdio whose store is another serve's ledger
// (--store http://…, token from the environment) records there.
func TestServeStdioOnStoreHTTP(t *testing.T) {
	t.Parallel()
	_, url, _ := teamServe(t)
	base := strings.TrimSuffix(url, mcpwire.Path)
	cmd := exec.Command(bin, "serve", "--stdio", "--store", base, "--namespace", "team")
	cmd.Env = append(os.Environ(), tokenEnv+"="+ledgerToken)
	cmd.Stderr = os.Stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil)
	s, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	defer s.Close()
	p := &stdioServe{cmd: cmd, s: s}
	key := p.charge(t, "invoice:7")
	mcpc, err := mcpserver.Dial(t.Context(), url, serveToken)
	require.NoError(t, err)
	defer mcpc.Close()
	v, err := mcpc.Inspect(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, v.State)
}

// TestTwoProxiesShareOneStore: two hosts each start `toolfence proxy` with the same embedded
// --store (in front of their own upstream, a toolfence serve --stdio, themselves sharing one
// store): both serve, and the same call through both is dispatched once (the second is a
// replay).
func TestTwoProxiesShareOneStore(t *testing.T) {
	t.Parallel()
	store, upstreamStore := sharedStore(t), sharedStore(t)
	connect := func() *mcp.ClientSession {
		cmd := exec.Command(bin, "proxy", "--store", store, "--server-id", "tf", "--", bin, "serve", "--stdio", "--store", upstreamStore)
		cmd.Stderr = os.Stderr
		c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil)
		s, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := connect(), connect()
	args := map[string]any{"task": "t", "operation": "charge", "target": "invoice:1", "args": map[string]any{"amount": 5}}
	first, err := a.CallTool(t.Context(), &mcp.CallToolParams{Name: "begin_call", Arguments: args})
	require.NoError(t, err)
	require.False(t, first.IsError)
	require.Nil(t, first.Meta["toolfence.dev/replayed"])
	second, err := b.CallTool(t.Context(), &mcp.CallToolParams{Name: "begin_call", Arguments: args})
	require.NoError(t, err)
	require.False(t, second.IsError)
	require.Equal(t, true, second.Meta["toolfence.dev/replayed"], "the second proxy replays what the first recorded")

	rs := jsonLines(t, ok(t, "ls", "--store", upstreamStore, "--json").stdout)
	require.Len(t, rs, 1, "the upstream was called once")
	require.Equal(t, 1, rs[0].AttemptCount)
	rs = jsonLines(t, ok(t, "ls", "--store", store, "--json").stdout)
	require.Len(t, rs, 1, "one residual in the proxies' store")
	require.Equal(t, residual.Succeeded, rs[0].State)
}

// TestStoreHTTPWithoutTokens: a serve --http without tokens (loopback only) serves the ledger
// bound to its --namespace: that namespace works, another is refused.
func TestStoreHTTPWithoutTokens(t *testing.T) {
	t.Parallel()
	store := filepath.Join(t.TempDir(), "store")
	cmd := exec.Command(bin, "serve", "--http", "127.0.0.1:0", "--store", store, "--namespace", "solo")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line := make([]byte, 512)
	n, err := stderr.Read(line)
	require.NoError(t, err)
	m := regexp.MustCompile(`serving MCP at (http://\S+)/mcp `).FindStringSubmatch(string(line[:n]))
	require.NotNil(t, m, "%s", line[:n])
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	base := m[1]

	r := ok(t, "ls", "--store", base, "--namespace", "solo")
	require.Contains(t, r.stderr, "no residuals")
	fails(t, 1, []string{`refused namespace "default" (403)`, `bound to namespace "solo"`}, "ls", "--store", base)
}

// TestStoreInTheMakingIsAStore: a directory holding only what badger writes before its
// manifest (another process is creating the store) may be opened; one with other files not.
func TestStoreInTheMakingIsAStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, n := range []string{"LOCK", "KEYREGISTRY", ownerSocket + ".tmp42"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), nil, 0o600))
	}
	require.NoError(t, checkStoreDir(dir, false))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), nil, 0o600))
	require.ErrorContains(t, checkStoreDir(dir, false), "is a directory with other files in it")
}

// TestTwoServeStdioStartTogether: two serves started at the same moment on a store that does
// not exist yet both serve (one creates it, the other goes through it).
func TestTwoServeStdioStartTogether(t *testing.T) {
	t.Parallel()
	store := sharedStore(t)
	started := make(chan *stdioServe, 2)
	for range 2 {
		go func() {
			cmd := exec.Command(bin, "serve", "--stdio", "--store", store)
			cmd.Stderr = os.Stderr
			c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil)
			s, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
			if err != nil {
				t.Errorf("connect: %v", err)
				started <- nil
				return
			}
			t.Cleanup(func() { _ = s.Close() })
			started <- &stdioServe{cmd: cmd, s: s}
		}()
	}
	a, b := <-started, <-started
	require.NotNil(t, a)
	require.NotNil(t, b)
	key := a.charge(t, "invoice:1")
	require.Equal(t, residual.Succeeded, b.inspect(t, key).State)
}
