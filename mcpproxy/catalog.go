package mcpproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolfence/toolfence/mcpproxy/policy"
)

// ListTools opens an MCP session on conn (a fresh connection to an upstream server: it
// sends initialize and notifications/initialized) and returns every tool the upstream lists,
// following nextCursor. Requests the upstream sends meanwhile are answered "method not
// found"; notifications are dropped. It returns an error naming the step that failed (the
// upstream gone, a JSON-RPC error, a malformed answer); ctx bounds the whole exchange.
func ListTools(ctx context.Context, conn mcp.Connection) ([]policy.Tool, error) {
	var seq int
	call := func(method string, params any) (json.RawMessage, error) {
		seq++
		id, _ := jsonrpc.MakeID("toolfence-lock:" + strconv.Itoa(seq))
		raw, err := json.Marshal(params)
		if err != nil {
			return nil, err
		}
		if err := conn.Write(ctx, &jsonrpc.Request{ID: id, Method: method, Params: raw}); err != nil {
			return nil, fmt.Errorf("mcpproxy: sending %s upstream: %w", method, err)
		}
		for {
			msg, err := conn.Read(ctx)
			if err != nil {
				return nil, fmt.Errorf("mcpproxy: waiting for the upstream's answer to %s: %w", method, err)
			}
			switch m := msg.(type) {
			case *jsonrpc.Response:
				if m.ID != id {
					continue
				}
				if m.Error != nil {
					return nil, fmt.Errorf("mcpproxy: the upstream answered %s with an error: %w", method, m.Error)
				}
				return m.Result, nil
			case *jsonrpc.Request:
				if m.IsCall() {
					_ = conn.Write(ctx, &jsonrpc.Response{ID: m.ID, Error: &jsonrpc.Error{
						Code: jsonrpc.CodeMethodNotFound, Message: "toolfence proxy lock/check answers no requests"}})
				}
			}
		}
	}
	if _, err := call("initialize", map[string]any{
		"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "toolfence-proxy", "version": "1"},
	}); err != nil {
		return nil, err
	}
	if err := conn.Write(ctx, &jsonrpc.Request{Method: "notifications/initialized", Params: json.RawMessage(`{}`)}); err != nil {
		return nil, fmt.Errorf("mcpproxy: sending notifications/initialized upstream: %w", err)
	}
	var out []policy.Tool
	cursor := ""
	for {
		params := map[string]any{}
		if cursor != "" {
			params["cursor"] = cursor
		}
		res, err := call("tools/list", params)
		if err != nil {
			return nil, err
		}
		var page struct {
			Tools      []json.RawMessage `json:"tools"`
			NextCursor string            `json:"nextCursor"`
		}
		if err := json.Unmarshal(res, &page); err != nil {
			return nil, fmt.Errorf("mcpproxy: the upstream's tools/list answer is malformed: %w", err)
		}
		for _, def := range page.Tools {
			t, err := policy.ParseTool(def)
			if err != nil {
				return nil, fmt.Errorf("mcpproxy: the upstream's tools/list answer: %w", err)
			}
			out = append(out, policy.Tool{Name: t.Name, Definition: def})
		}
		if cursor = page.NextCursor; cursor == "" {
			return out, nil
		}
	}
}
