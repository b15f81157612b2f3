package mcpserver_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
)

// modernCall is the body of a stateless (2026-07-28) tools/call of tool with arguments args.
func modernCall(tool, args string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{%q:%q,%q:{"name":"probe","version":"1"},%q:{}},"name":%q,"arguments":%s}}`,
		mcp.MetaKeyProtocolVersion, modern, "io.modelcontextprotocol/clientInfo", "io.modelcontextprotocol/clientCapabilities", tool, args)
}

// postModern sends body (a tools/call from modernCall) as a stateless request with token
// and returns the status and body.
func postModern(t *testing.T, url, token, body string) (int, string) {
	t.Helper()
	var call struct {
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	_ = json.Unmarshal([]byte(body), &call)
	status, _, answer := send(t, http.MethodPost, url, token, body,
		"Mcp-Protocol-Version", modern, mcp.HeaderMethod, "tools/call", mcp.HeaderName, call.Params.Name)
	return status, answer
}

// hostileBegin is a begin_call of about size bytes whose args hold an array of empty objects.
func hostileBegin(size int) string {
	n := size / 3
	return modernCall(mcpserver.ToolBegin, `{"task":"t","operation":"op","target":"x","args":{"a":[`+strings.Repeat("{},", n-1)+`{}]}}`)
}

// allocated returns the bytes allocated while f ran (in this process: server and client).
func allocated(f func()) uint64 {
	runtime.GC()
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// TestHostileRequestBounded: a 2 MiB begin_call whose args are an array of empty objects is
// refused before it is decoded (it cost ~70 MB to decode before), and so is JSON nested
// past MaxDepth; a begin_call of ordinary shape still works.
func TestHostileRequestBounded(t *testing.T) {
	e := setupWith(t, interceptor.Options{MaxArgs: interceptor.DefaultMaxArgs, MaxResult: interceptor.DefaultMaxResult}, nil)
	body := hostileBegin(2 << 20)
	var status int
	var answer string
	cost := allocated(func() { status, answer = postModern(t, e.url, tokA, body) })
	t.Logf("hostile begin_call of %d KiB: HTTP %d, %.1f MB allocated", len(body)>>10, status, float64(cost)/1e6)
	require.Equal(t, http.StatusBadRequest, status, answer)
	require.Contains(t, answer, "values")
	require.Less(t, cost, uint64(24<<20), "refused before it was materialised")

	// For comparison (as before the bound): the same request decoded whole.
	loose := setupWith(t, interceptor.Options{MaxArgs: interceptor.DefaultMaxArgs, MaxResult: interceptor.DefaultMaxResult},
		func(o *mcpserver.Options) { o.MaxValues = 1 << 30 })
	unbounded := allocated(func() { status, _ = postModern(t, loose.url, tokA, body) })
	t.Logf("the same without the bound: HTTP %d, %.1f MB allocated", status, float64(unbounded)/1e6)
	require.Greater(t, unbounded, 4*cost)

	deep := modernCall(mcpserver.ToolBegin, `{"task":"t","operation":"op","target":"x","args":{"a":`+strings.Repeat("[", 100)+strings.Repeat("]", 100)+`}}`)
	status, answer = postModern(t, e.url, tokA, deep)
	require.Equal(t, http.StatusBadRequest, status, answer)
	require.Contains(t, answer, "levels deep")

	// The most an accepted request can cost: just under MaxValues empty objects.
	n := mcpwire.DefaultMaxValues/2 - 10
	largest := modernCall(mcpserver.ToolBegin, `{"task":"t","operation":"op","target":"x2","args":{"a":[`+strings.Repeat("{},", n-1)+`{}]}}`)
	cost = allocated(func() { status, answer = postModern(t, e.url, tokA, largest) })
	t.Logf("largest accepted shape (%d empty objects, %d KiB): HTTP %d, %.1f MB allocated", n, len(largest)>>10, status, float64(cost)/1e6)
	require.Equal(t, http.StatusOK, status, answer)

	// And the largest accepted size: args of one string just under MaxArgs.
	big := modernCall(mcpserver.ToolBegin, `{"task":"t","operation":"op","target":"x3","args":{"s":"`+strings.Repeat("x", interceptor.DefaultMaxArgs-16)+`"}}`)
	cost = allocated(func() { status, answer = postModern(t, e.url, tokA, big) })
	t.Logf("largest accepted size (%d KiB of args): HTTP %d, %.1f MB allocated", len(big)>>10, status, float64(cost)/1e6)
	require.Equal(t, http.StatusOK, status, answer)

	ordinary := modernCall(mcpserver.ToolBegin, `{"task":"t","operation":"op","target":"x","args":{"a":[`+strings.Repeat("{},", 999)+`{}]}}`)
	status, answer = postModern(t, e.url, tokA, ordinary)
	require.Equal(t, http.StatusOK, status, answer)
	require.Contains(t, answer, mcpserver.DecisionProceed)
}

// TestOversizedBodyIs413: a body past MaxArgs+MaxResult+1 MiB gets 413, as documented.
func TestOversizedBodyIs413(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	status, answer := postModern(t, e.url, tokA, modernCall(mcpserver.ToolBegin, `{"task":"`+strings.Repeat("x", 2<<20)+`"}`))
	require.Equal(t, http.StatusRequestEntityTooLarge, status, answer)
	require.Contains(t, answer, "exceeds")
}

// TestInFlightBounded: requests past MaxInFlight for one token get 429 with Retry-After and
// a JSON-RPC error, other tokens are served, and slots come back when requests end.
func TestInFlightBounded(t *testing.T) {
	t.Parallel()
	const perToken = 3
	e := setup(t, func(o *mcpserver.Options) { o.MaxInFlight, o.MaxInFlightTotal = perToken, perToken+1 })
	addr := strings.TrimPrefix(e.ts.URL, "http://")
	// Requests whose bodies have not arrived yet hold their slots.
	held := make([]net.Conn, perToken)
	for i := range held {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		defer c.Close()
		_, err = fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n", tokA)
		require.NoError(t, err)
		held[i] = c
	}
	// Wait until the held requests are in the handler: a probe sent while one of them is
	// still on its way could take its slot and leave it refused instead.
	deadline := time.Now().Add(60 * time.Second)
	for e.srv.InFlight() < perToken && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	require.Equal(t, perToken, e.srv.InFlight(), "the held requests hold their slots")
	status, answer := postModern(t, e.url, tokA, modernCall(mcpserver.ToolListPending, `{}`))
	require.Equal(t, http.StatusTooManyRequests, status, answer)
	var rpc struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(answer), &rpc))
	require.Contains(t, rpc.Error.Message, "retry")

	status, answer = postModern(t, e.url, tokB, modernCall(mcpserver.ToolListPending, `{}`))
	require.Equal(t, http.StatusOK, status, "another token has its own slots: %s", answer)
	status, _ = postModern(t, e.url, tokB, modernCall(mcpserver.ToolListPending, `{}`))
	require.Equal(t, http.StatusOK, status)

	// The held requests end (their bodies are malformed JSON: 4xx); the slots return.
	var wg sync.WaitGroup
	for _, c := range held {
		wg.Go(func() {
			_, _ = io.WriteString(c, strings.Repeat(" ", 100))
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	status, answer = postModern(t, e.url, tokA, modernCall(mcpserver.ToolListPending, `{}`))
	require.Equal(t, http.StatusOK, status, answer)
}
