package mcpproxy_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/residual"
)

// cutTransport drops the first tools/call POST stream it carries right after its first
// event (the proxy's priming event), as a broken network would, and records the
// Last-Event-ID of every GET.
type cutTransport struct {
	token string
	cut   chan struct{} // closed once the stream was cut

	mu      sync.Mutex
	done    bool
	lastIDs []string
}

func (c *cutTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+c.token)
	call := false
	if r.Method == http.MethodPost && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		call = bytes.Contains(body, []byte(`"tools/call"`))
	}
	c.mu.Lock()
	if v, ok := r.Header["Last-Event-Id"]; ok && r.Method == http.MethodGet {
		c.lastIDs = append(c.lastIDs, v[0])
	}
	cut := call && !c.done
	c.done = c.done || cut
	c.mu.Unlock()
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil && cut {
		resp.Body = &cutBody{body: resp.Body, cut: c.cut}
	}
	return resp, err
}

func (c *cutTransport) ids() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lastIDs...)
}

// cutBody gives the first event of body, then closes body and fails like a dropped
// connection.
type cutBody struct {
	body    io.ReadCloser
	cut     chan struct{}
	pending []byte
	read    bool
}

func (b *cutBody) Read(p []byte) (int, error) {
	if !b.read {
		b.read = true
		br := bufio.NewReader(b.body)
		for {
			line, err := br.ReadBytes('\n')
			b.pending = append(b.pending, line...)
			if err != nil || len(bytes.TrimSpace(line)) == 0 {
				break
			}
		}
		b.body.Close()
		close(b.cut)
	}
	if len(b.pending) > 0 {
		n := copy(p, b.pending)
		b.pending = b.pending[n:]
		return n, nil
	}
	return 0, io.ErrUnexpectedEOF
}

func (b *cutBody) Close() error { return nil }

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// An official Go SDK host whose tools/call stream drops after the proxy's priming event
// reconnects as MCP 2025-11-25 says: it waits the proxy's retry and sends GET with the
// priming event's id as Last-Event-ID. The proxy kept the stream meanwhile: the upstream's
// answer, which came after the drop, is replayed on the resumed stream, so the protected
// call completes once, recorded succeeded, not unknown.
func TestHTTPHostResumesDroppedStreamWithGoSDK(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "")
	release := make(chan struct{})
	var runs atomic.Int32
	dial := func(ctx context.Context) (mcp.Connection, io.Closer, error) {
		srv := mcp.NewServer(&mcp.Implementation{Name: "slow", Version: "1"}, nil)
		mcp.AddTool(srv, &mcp.Tool{Name: "charge", Description: "Charge a card."},
			func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				runs.Add(1)
				select {
				case <-release:
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "charged"}}}, nil, nil
			})
		ct, st := mcp.NewInMemoryTransports()
		ss, err := srv.Connect(ctx, st, nil)
		if err != nil {
			return nil, nil, err
		}
		conn, err := ct.Connect(ctx)
		if err != nil {
			return nil, nil, err
		}
		return conn, closerFunc(ss.Close), nil
	}
	url, _ := w.serveHTTP(mcpproxy.HTTPOptions{Dial: dial}, map[string]string{tokenA: "default"})
	cut := &cutTransport{token: tokenA, cut: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "sdk-host", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: cut}}, legacy)
	require.NoError(t, err)
	defer s.Close()
	go func() {
		<-cut.cut
		close(release) // the answer comes after the host's connection dropped
	}()
	start := time.Now()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{}})
	require.NoError(t, err)
	require.False(t, res.IsError, text(res))
	require.Equal(t, "charged", text(res))
	require.GreaterOrEqual(t, time.Since(start), time.Second, "the host waited the proxy's retry (1000 ms)")
	ids := cut.ids()
	require.Len(t, ids, 1, "one resumption")
	require.Regexp(t, regexp.MustCompile(`^[0-9]+_0$`), ids[0], "from the priming event")
	require.EqualValues(t, 1, runs.Load(), "the tool ran once")
	rs := w.residuals("default")
	require.Len(t, rs, 1)
	require.Equal(t, residual.Succeeded, rs[0].State)
}
