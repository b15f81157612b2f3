package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// clientCapabilities are the capabilities `proxy lock` and `proxy check` may declare in
// their initialize, as hosts do: a server may list some tools only to a host that declared
// one of them (server-everything's sampling, elicitation and roots tools).
var clientCapabilities = []string{"sampling", "elicitation", "roots"}

// checkCapabilities rejects a --capabilities entry that is not one of clientCapabilities.
func checkCapabilities(caps []string) error {
	for _, c := range caps {
		if !slices.Contains(clientCapabilities, c) {
			return usagef("--capabilities: unknown capability %q: give some of %s, or --capabilities= for none", c, strings.Join(clientCapabilities, ","))
		}
	}
	return nil
}

// capsConn is the connection to the upstream as lock and check use it: their initialize
// declares caps, and a roots/list request of the upstream is answered with no roots when
// roots is declared. (Every other request of the upstream, sampling and elicitation
// included, is answered with an error by mcpproxy.ListTools: no call waits for a person.)
type capsConn struct {
	mcp.Connection
	caps []string
}

func (c *capsConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if req, ok := msg.(*jsonrpc.Request); ok && req.Method == "initialize" {
		var params map[string]any
		if err := json.Unmarshal(req.Params, &params); err != nil {
			return fmt.Errorf("declaring the client capabilities: %w", err)
		}
		declared := map[string]any{}
		for _, name := range c.caps {
			declared[name] = map[string]any{}
		}
		params["capabilities"] = declared
		raw, err := json.Marshal(params)
		if err != nil {
			return fmt.Errorf("declaring the client capabilities: %w", err)
		}
		copied := *req
		copied.Params = raw
		msg = &copied
	}
	return c.Connection.Write(ctx, msg)
}

func (c *capsConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		msg, err := c.Connection.Read(ctx)
		if err != nil {
			return nil, err
		}
		req, ok := msg.(*jsonrpc.Request)
		if !ok || !req.IsCall() || req.Method != "roots/list" || !slices.Contains(c.caps, "roots") {
			return msg, nil
		}
		if err := c.Connection.Write(ctx, &jsonrpc.Response{ID: req.ID, Result: json.RawMessage(`{"roots":[]}`)}); err != nil {
			return nil, fmt.Errorf("answering the upstream's roots/list: %w", err)
		}
	}
}
