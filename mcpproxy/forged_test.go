package mcpproxy_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
	"github.com/toolfence/toolfence/residual"
)

// newStdioRig is newRig with the proxy serving both sides over pipes (newPipeSession), as
// `toolfence proxy` serves a stdio host and a stdio upstream.
func newStdioRig(t *testing.T, cfg mcpproxy.Options) *rig {
	t.Helper()
	cfg.ServerID = "fx"
	ps := newPipeSession(t, interceptor.Options{LeaseTTL: 5 * time.Second}, cfg)
	end := func(c mcp.Connection) *rawEnd {
		t.Cleanup(func() { c.Close() })
		return rawOf(c)
	}
	return &rig{ic: ps.ic, l: ps.l, cfg: cfg,
		host: end(transport.Stdio(ps.hostR, ps.hostW)), up: end(transport.Stdio(ps.upR, ps.upW))}
}

// A hostile upstream that answers, itself, the host's id of a protected call (which the
// proxy sent upstream under its own id) must not reach the host: the host gets exactly the
// proxy's answer, the one the ledger recorded. Nor does a second answer to a relayed call
// reach the host twice. Each dropped id is logged once, with the server id.
func TestProxyDropsUpstreamAnswersToNoRelayedRequest(t *testing.T) {
	for _, c := range []struct {
		name string
		rig  func(*testing.T, mcpproxy.Options) *rig
	}{
		{"stdio", newStdioRig},
		{"in-memory", func(t *testing.T, cfg mcpproxy.Options) *rig { return newRig(t, cfg, nil) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			logs := &lockedBuffer{}
			r := c.rig(t, mcpproxy.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
			note := func() {
				t.Helper()
				require.NoError(t, r.up.conn.Write(context.Background(), &jsonrpc.Request{Method: "notifications/message",
					Params: []byte(`{"level":"info","data":"marker"}`)}))
				m, ok := r.host.next(t).(*jsonrpc.Request)
				require.True(t, ok, "the host's next message is the marker, not an answer")
				require.Equal(t, "notifications/message", m.Method)
			}

			// A protected call: upstream answers the host's id first, then the proxy's.
			r.host.send(t, float64(1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
			r.listed(t, chargeDef, readDef)
			guarded := r.up.nextReq(t)
			require.Equal(t, "tools/call", guarded.Method)
			require.Regexp(t, proxyID, guarded.ID.Raw())
			one, _ := jsonrpc.MakeID(float64(1))
			r.up.answer(t, one, `{"content":[{"type":"text","text":"forged"}]}`)
			r.up.answer(t, one, `{"content":[{"type":"text","text":"forged again"}]}`)
			r.up.answer(t, guarded.ID, `{"content":[{"type":"text","text":"charged"}]}`)
			got := r.hostResult(t, 1)
			require.Contains(t, got, "charged")
			require.NotContains(t, got, "forged")
			rs := r.residuals(t)
			require.Len(t, rs, 1)
			require.Equal(t, residual.Succeeded, rs[0].State)
			require.Contains(t, string(rs[0].Result), "charged", "the host's answer is the ledger's")
			note() // nothing else reached the host

			// A bypassed call answered twice: the host gets the first answer only.
			r.host.send(t, float64(2), "tools/call", `{"name":"read","arguments":{}}`)
			relayed := r.up.nextReq(t)
			require.EqualValues(t, 2, relayed.ID.Raw())
			r.up.answer(t, relayed.ID, `{"content":[{"type":"text","text":"first"}]}`)
			r.up.answer(t, relayed.ID, `{"content":[{"type":"text","text":"second"}]}`)
			r.up.answer(t, relayed.ID, `{"content":[{"type":"text","text":"third"}]}`)
			require.Contains(t, r.hostResult(t, 2), "first")
			note()

			// An answer to an id the host never used, and one to a relayed ping, twice.
			r.host.send(t, float64(3), "ping", `{}`)
			ping := r.up.nextReq(t)
			r.up.answer(t, ping.ID, `{}`)
			r.up.answer(t, ping.ID, `{}`)
			nobody, _ := jsonrpc.MakeID("nobody")
			r.up.answer(t, nobody, `{}`)
			resp, ok := r.host.next(t).(*jsonrpc.Response)
			require.True(t, ok)
			require.EqualValues(t, 3, resp.ID.Raw())
			note()

			out := logs.String()
			for _, id := range []string{"id=1\n", "id=2\n", "id=3\n", "id=nobody\n"} {
				require.Equal(t, 1, strings.Count(out, `no relayed host request waits for it" server=fx `+id), "logged once: %s\n%s", id, out)
			}
		})
	}
}

// A relayed request the host cancels is no longer in flight: the cancellation goes
// upstream, and an answer upstream sends anyway does not reach the host (nor does the
// session keep waiting for one).
func TestProxyForgetsACancelledRelayedRequest(t *testing.T) {
	t.Parallel()
	r := newStdioRig(t, mcpproxy.Options{})
	r.host.send(t, float64(7), "resources/read", `{"uri":"fx://a"}`)
	relayed := r.up.nextReq(t)
	require.EqualValues(t, 7, relayed.ID.Raw())
	require.NoError(t, r.host.conn.Write(context.Background(), &jsonrpc.Request{Method: "notifications/cancelled",
		Params: []byte(`{"requestId":7,"reason":"user gave up"}`)}))
	cancel, ok := r.up.next(t).(*jsonrpc.Request)
	require.True(t, ok)
	require.Equal(t, "notifications/cancelled", cancel.Method, "the cancellation is relayed")
	r.up.answer(t, relayed.ID, `{"contents":[]}`)
	require.NoError(t, r.up.conn.Write(context.Background(), &jsonrpc.Request{Method: "notifications/message",
		Params: []byte(`{"level":"info","data":"marker"}`)}))
	m, ok := r.host.next(t).(*jsonrpc.Request)
	require.True(t, ok, "the host's next message is the marker, not the cancelled request's answer")
	require.Equal(t, "notifications/message", m.Method)
}

// An upstream that answers ever new ids gets one log line per id for the first 256, then
// lines at powers of two of the count: its answers cannot flood the log.
func TestProxyDroppedAnswersDoNotFloodTheLog(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	r := newRig(t, mcpproxy.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))}, nil)
	r.nothingSentUpstream(t, 1) // the host speaks first: the proxy reads upstream from then on
	const n = 2000
	for i := range n {
		id, _ := jsonrpc.MakeID(float64(1000 + i))
		r.up.answer(t, id, `{}`)
	}
	require.NoError(t, r.up.conn.Write(context.Background(), &jsonrpc.Request{Method: "notifications/message",
		Params: []byte(`{"level":"info","data":"marker"}`)}))
	m, ok := r.host.next(t).(*jsonrpc.Request)
	require.True(t, ok, "no dropped answer reached the host")
	require.Equal(t, "notifications/message", m.Method)
	out := logs.String()
	require.Equal(t, 256, strings.Count(out, "an upstream answer was dropped"))
	require.Equal(t, 11, strings.Count(out, "upstream answers were dropped"), "at 1, 2, 4 … 1024 more of 1744")
	require.Contains(t, out, "more=1024")
}
