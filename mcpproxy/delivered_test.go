package mcpproxy_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpproxy"
)

// slowFirstAnswer is the proxy's end of a host connection whose Write of the answer to
// request 1 returns only after the answer to request 2 was written (or 5 s): the host reads
// answer 1 and sends request 2 while the proxy is still inside that Write, as happens when
// the goroutine that wrote it is not scheduled at once.
type slowFirstAnswer struct {
	mcp.Connection
	second chan struct{}
	once   sync.Once
}

func (c *slowFirstAnswer) Write(ctx context.Context, m jsonrpc.Message) error {
	err := c.Connection.Write(ctx, m)
	if r, ok := m.(*jsonrpc.Response); ok {
		switch r.ID.Raw() {
		case float64(1), int64(1):
			select {
			case <-c.second:
			case <-time.After(5 * time.Second):
			}
		case float64(2), int64(2):
			c.once.Do(func() { close(c.second) })
		}
	}
	return err
}

// An identical call the host sends as soon as it read the first call's answer finds that
// answer delivered, however late the goroutine that wrote it records it: judged as a
// possible new intent (the host's user would be asked; without elicitation it is answered
// from the ledger saying so), not as a retry of an answer the host never had.
func TestProxyRepeatSeesTheAnswerTheHostRead(t *testing.T) {
	r := newRigWrapped(t, mcpproxy.Options{}, nil, func(down mcp.Connection) mcp.Connection {
		return &slowFirstAnswer{Connection: down, second: make(chan struct{})}
	})
	r.host.send(t, float64(1), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	r.listed(t, chargeDef)
	call := r.up.nextReq(t)
	r.up.answer(t, call.ID, `{"content":[{"type":"text","text":"charged A"}]}`)
	require.Contains(t, r.hostResult(t, 1), "charged A")
	r.host.send(t, float64(2), "tools/call", `{"name":"charge","arguments":{"order":"A"}}`)
	again := r.hostResult(t, 2)
	require.Contains(t, again, "not sent")
	require.Contains(t, again, "the host had the earlier answer", "judged with answer 1 delivered")
	require.NotContains(t, again, "may not have reached the host")
}
