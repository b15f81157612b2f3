package mcpproxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/fixture/mcpfixture"
	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
	"github.com/toolfence/toolfence/mcpwire"
)

// The test binary is also the Go SDK fixture of internal/fixture/mcpfixture over stdio
// (TOOLFENCE_TEST_ROLE=gosdkfixture): it speaks 2026-07-28 as well as 2025-11-25.
func init() {
	if testkit.Role() != "gosdkfixture" {
		return
	}
	if err := mcpfixture.RunGoSDK(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "gosdkfixture:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// childRig serves a proxy over HTTP to hosts of tokenA, each session with a real stdio
// child of its own (HTTPOptions.Children: the Go SDK fixture), on a fake clock, and counts
// the children: one is alive from its start until its Close returned (it has exited and
// been reaped).
type childRig struct {
	url                    string
	h                      *mcpproxy.HTTPServer
	clock                  *lease.Fake
	ended                  chan string // ids of ended sessions (OnSessionEnd)
	effects, entered, gate string      // the fixture's files (mcpfixture.EnvEffects, ...)

	mu          sync.Mutex
	alive, most int
	pids        []int // in the order the children started
}

func newChildRig(t *testing.T, opts mcpproxy.HTTPOptions) *childRig {
	t.Helper()
	w := newWorld(t, "")
	r := &childRig{clock: lease.NewFake(time.Now()), ended: make(chan string, 64),
		effects: filepath.Join(w.dir, "fx-effects"), entered: filepath.Join(w.dir, "fx-entered"), gate: filepath.Join(w.dir, "fx-gate")}
	require.NoError(t, syscall.Mkfifo(r.entered, 0o600))
	require.NoError(t, syscall.Mkfifo(r.gate, 0o600))
	opts.Dial = func(ctx context.Context) (mcp.Connection, io.Closer, error) {
		up, err := transport.StartUpstream(ctx, []string{"env", testkit.WithRole("gosdkfixture"), mcpfixture.EnvEffects + "=" + r.effects,
			mcpfixture.EnvEntered + "=" + r.entered, mcpfixture.EnvGate + "=" + r.gate, os.Args[0]}, os.Stderr)
		if err != nil {
			return nil, nil, err
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.alive++
		r.most = max(r.most, r.alive)
		r.pids = append(r.pids, up.Pid())
		return up.Conn(), &countedChild{Closer: up, r: r}, nil
	}
	opts.Clock, opts.Children = r.clock, true
	opts.OnSessionEnd = func(id string) { r.ended <- id }
	r.url, r.h = w.serveHTTP(opts, map[string]string{tokenA: "default"})
	return r
}

// effectCount is the number of effects the fixture's mutating tools wrote.
func (r *childRig) effectCount(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(r.effects)
	if os.IsNotExist(err) {
		return 0
	}
	require.NoError(t, err)
	return strings.Count(string(b), "\n")
}

// awaitEntered waits until a call in mcpfixture.ModeGate has had its effect and waits.
func (r *childRig) awaitEntered(t *testing.T) {
	t.Helper()
	read := make(chan error, 1)
	go func() {
		_, err := os.ReadFile(r.entered)
		read <- err
	}()
	select {
	case err := <-read:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the call never reached the fixture")
	}
}

// release lets the call waiting in mcpfixture.ModeGate answer.
func (r *childRig) release(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(r.gate, os.O_WRONLY, 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// countedChild counts its child dead once Close returned.
type countedChild struct {
	io.Closer
	r    *childRig
	once sync.Once
}

func (c *countedChild) Close() error {
	err := c.Closer.Close()
	c.once.Do(func() {
		c.r.mu.Lock()
		c.r.alive--
		c.r.mu.Unlock()
	})
	return err
}

// counts returns the children alive now, the most alive at once and the pids so far.
func (r *childRig) counts() (alive, most int, pids []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.alive, r.most, append([]int(nil), r.pids...)
}

// post sends one JSON-RPC body as tokenA in session ("" for none), accepting JSON only,
// and returns the answer (the session's request is released before its body is sent).
func (r *childRig) post(t *testing.T, session, body string) answer {
	t.Helper()
	return <-(&limitRig{url: r.url}).postAsync(t, tokenA, session, "application/json", body)
}

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

// open initializes a session (a host that never sends DELETE) and returns its id.
func (r *childRig) open(t *testing.T) string {
	t.Helper()
	a := r.post(t, "", initBody)
	require.Equal(t, http.StatusOK, a.status, a.body)
	id := a.header.Get("Mcp-Session-Id")
	require.NotEmpty(t, id)
	return id
}

// ping pings session and returns the status of the answer.
func (r *childRig) ping(t *testing.T, session string) int {
	t.Helper()
	return r.post(t, session, `{"jsonrpc":"2.0","id":"p","method":"ping"}`).status
}

// reaped fails unless the process pid has exited and been reaped.
func reaped(t *testing.T, pid int) {
	t.Helper()
	require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "child %d is gone", pid)
}

// TestHTTPChildrenCappedOverThirtySessions: 30 host sessions opened without DELETE (as one
// conformance run does), each with a real child: never more than DefaultMaxChildren children
// alive at once; each session past the cap ends the least recently used one (a session used
// since it opened outlives the ones opened after it but not used), whose child is reaped
// before the new one starts; the sessions left answer, the ended ones get 404.
func TestHTTPChildrenCappedOverThirtySessions(t *testing.T) {
	t.Parallel()
	r := newChildRig(t, mcpproxy.HTTPOptions{})
	limit := mcpwire.DefaultMaxChildren
	sessions := make([]string, 0, 30)
	for range limit {
		sessions = append(sessions, r.open(t))
		r.clock.Advance(time.Second)
	}
	require.Equal(t, http.StatusOK, r.ping(t, sessions[0]), "the first session is now the most recently used")
	for len(sessions) < 30 {
		r.clock.Advance(time.Second)
		sessions = append(sessions, r.open(t))
		alive, _, _ := r.counts()
		require.LessOrEqual(t, alive, limit)
	}
	alive, most, pids := r.counts()
	require.Len(t, pids, 30, "one child per session")
	require.Equal(t, limit, most, "never more than the cap alive at once")
	require.Equal(t, limit, alive)
	require.Equal(t, limit, r.h.Sessions())
	ended := len(pids) - limit
	for i := range ended {
		reaped(t, pids[1+i]) // sessions 1..ended were the least recently used
		select {
		case <-r.ended:
		case <-time.After(30 * time.Second):
			t.Fatal("an ended session was not reported")
		}
	}
	require.NoError(t, syscall.Kill(pids[0], 0), "the session used since it opened lives")
	require.Equal(t, http.StatusOK, r.ping(t, sessions[0]))
	require.Equal(t, http.StatusNotFound, r.ping(t, sessions[1]), "an ended session is unknown: the host initializes anew")
	require.Equal(t, http.StatusOK, r.ping(t, sessions[29]))
}

// TestHTTPChildSessionWithACallIsNotEnded: at a cap of one child, a Go SDK host's session
// with a tools/call in flight is never ended: a new session gets 429 with Retry-After and
// the idle sweep passes it over, however long the call runs, while the session answers.
// Once the call is answered, the session holds only its notification stream, which keeps
// nothing: a new session ends it, and starts its child once the old one is reaped.
func TestHTTPChildSessionWithACallIsNotEnded(t *testing.T) {
	t.Parallel()
	r := newChildRig(t, mcpproxy.HTTPOptions{MaxChildren: 1})
	s := sdkHost(t, r.url, tokenA, nil) // holds a notification stream (GET)
	called := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: mcpfixture.ToolAppend,
			Arguments: map[string]any{"target": "inbox:bob", "text": "hello"}, Meta: mcp.Meta{mcpfixture.MetaMode: mcpfixture.ModeGate}})
		if err != nil {
			res = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
		}
		called <- res
	}()
	r.awaitEntered(t) // the call had its effect upstream and waits there

	a := r.post(t, "", initBody)
	require.Equal(t, http.StatusTooManyRequests, a.status, a.body)
	require.Equal(t, "5", a.header.Get("Retry-After"))
	code, msg := rpcError(t, a.body)
	require.Equal(t, int64(-32000), code)
	require.Contains(t, msg, "toolfence proxy: busy: 1 sessions hold a child process of the upstream (the cap over all tokens), each with a request in flight")
	r.clock.Advance(mcpwire.DefaultChildIdle * 10)
	require.Zero(t, r.h.Sweep(), "a session with a call in flight is not idle")
	require.NoError(t, s.Ping(context.Background(), nil), "the busy session answers")
	_, _, pids := r.counts()
	require.Len(t, pids, 1, "the refused initialize started no child")
	require.NoError(t, syscall.Kill(pids[0], 0))

	r.release(t)
	res := <-called
	require.False(t, res.IsError, "%v", res.Content)
	require.Equal(t, 1, r.effectCount(t))
	// The call's POST stopped counting before its answer reached the host: the session has
	// only its notification stream now, and a new session takes its place.
	next := r.open(t)
	reaped(t, pids[0])
	alive, most, pids := r.counts()
	require.Len(t, pids, 2)
	require.Equal(t, 1, alive)
	require.Equal(t, 1, most, "the new child started after the old one exited")
	require.Equal(t, http.StatusOK, r.ping(t, next))
}

// TestHTTPChildSessionIdleDefault: without SessionIdle, a session with a child ends after
// DefaultChildIdle without requests on the server's clock, its open notification stream
// notwithstanding, and its child is reaped; a session whose upstream is no child keeps the
// longer DefaultSessionIdle.
func TestHTTPChildSessionIdleDefault(t *testing.T) {
	t.Parallel()
	r := newChildRig(t, mcpproxy.HTTPOptions{})
	quiet := r.open(t)
	listening := sdkHost(t, r.url, tokenA, nil) // holds a notification stream
	require.False(t, call(t, listening, "read", nil, nil).IsError)
	_, _, pids := r.counts()
	require.Len(t, pids, 2)

	r.clock.Advance(mcpwire.DefaultChildIdle - time.Second)
	require.Zero(t, r.h.Sweep(), "not idle yet")
	r.clock.Advance(time.Second)
	r.h.Sweep() // or the server's own sweeper, woken by the clock, ends them
	for range pids {
		select {
		case <-r.ended: // reported once its child has exited
		case <-time.After(30 * time.Second):
			t.Fatal("an idle session did not end")
		}
	}
	for _, pid := range pids {
		reaped(t, pid)
	}
	require.Equal(t, http.StatusNotFound, r.ping(t, quiet))
	require.Zero(t, r.h.Sessions())

	// No child: the session of an HTTP upstream keeps the longer default.
	lr := newLimitRig(t, mcpproxy.HTTPOptions{Clock: r.clock}, map[string]string{tokenA: "default"})
	session, up := lr.initialize(t, tokenA)
	r.clock.Advance(mcpwire.DefaultChildIdle)
	require.Zero(t, lr.h.Sweep())
	lr.ping(t, tokenA, session, up, "still")
	r.clock.Advance(mcpwire.DefaultSessionIdle)
	lr.h.Sweep()
	require.Eventually(t, func() bool { return lr.h.Sessions() == 0 }, 30*time.Second, 10*time.Millisecond)
}

// TestHTTPStatelessHostsShareOneChild: a Go SDK host left to choose its protocol speaks
// 2026-07-28 (stateless) through the proxy to a stdio upstream that does; with
// SharedUpstream its requests share one child: many calls start one child, and no session.
func TestHTTPStatelessHostsShareOneChild(t *testing.T) {
	t.Parallel()
	r := newChildRig(t, mcpproxy.HTTPOptions{SharedUpstream: true, MaxChildren: 1})
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := mcp.NewClient(&mcp.Implementation{Name: "stateless-host", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: r.url, HTTPClient: &http.Client{Transport: bearerTransport{tokenA}}, MaxRetries: -1}, nil)
		cancel()
		require.NoError(t, err)
		require.Empty(t, s.ID(), "a stateless exchange has no session")
		for j := range 4 {
			require.False(t, call(t, s, "read", nil, nil).IsError)
			res := call(t, s, "append", map[string]any{"target": "inbox:bob", "text": fmt.Sprintf("%d-%d", i, j)}, nil)
			require.False(t, res.IsError, "%v", res.Content)
		}
		require.NoError(t, s.Close())
	}
	require.Equal(t, 12, r.effectCount(t))
	alive, most, pids := r.counts()
	require.Len(t, pids, 1, "24 calls of 3 hosts started one child")
	require.Equal(t, 1, alive)
	require.Equal(t, 1, most)
	require.Zero(t, r.h.Sessions())
	// MaxChildren bounds sessions, not the shared child: a 2025-11-25 session opens beside it.
	require.Equal(t, http.StatusOK, r.ping(t, r.open(t)))
}
