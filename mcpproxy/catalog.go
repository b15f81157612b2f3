package mcpproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tool is one tool definition as an upstream server lists it.
type Tool struct {
	// Name is the tool's name.
	Name string
	// Definition is the whole tool object as upstream sent it.
	Definition json.RawMessage
}

// ListTools opens an MCP session on conn (a fresh connection to an upstream server: it
// sends initialize and notifications/initialized) and returns every tool the upstream lists,
// following nextCursor. Requests the upstream sends meanwhile are answered "method not
// found"; notifications are dropped. It returns an error naming the step that failed (the
// upstream gone, a JSON-RPC error, a malformed answer); ctx bounds the whole exchange.
func ListTools(ctx context.Context, conn mcp.Connection) ([]Tool, error) {
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
	var out []Tool
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
			t, err := parseTool(def)
			if err != nil {
				return nil, fmt.Errorf("mcpproxy: the upstream's tools/list answer: %w", err)
			}
			out = append(out, Tool{Name: t.Name, Definition: def})
		}
		if cursor = page.NextCursor; cursor == "" {
			return out, nil
		}
	}
}

// Report is what the proxy would do with each tool of an upstream (`toolfence proxy check`).
type Report struct {
	// Tools has one entry per tool the upstream lists, in its order.
	Tools []ToolReport
	// Problems are faults that refuse every call: a tool or probe tool the policy names that
	// the upstream does not list, pins taken for another server id.
	Problems []string
}

// ToolReport is the proxy's verdict on one upstream tool.
type ToolReport struct {
	// Name is the tool's name.
	Name string
	// Protect is the decision: true protect (through the barrier), false bypass.
	Protect bool
	// Why explains the decision (policy, annotation or default).
	Why string
	// Target is how keys get their target: the policy's pointers joined with ", ", or
	// "digest of arguments"; "" for a bypassed tool.
	Target string
	// Pin is "ok", "missing", "changed" or "unlisted" against the pins, "no pins" without
	// them; for a bypassed tool the status of its pin when it has one and the policy file
	// does not say bypass (such a tool is checked), else "".
	Pin string
	// Warnings are problems that do not refuse calls by themselves, and the reasons of
	// Refused.
	Warnings []string
	// Refused is true when every call of the tool would be refused, whatever its arguments.
	Refused bool
}

// Refused reports whether any call would be refused whatever its arguments.
func (r *Report) Refused() bool {
	if len(r.Problems) > 0 {
		return true
	}
	for _, t := range r.Tools {
		if t.Refused {
			return true
		}
	}
	return false
}

// Check applies the policy (nil: the zero Policy) and the pins (nil: none) to the tools an
// upstream lists, as the proxy would, and reports per tool the decision, the target, the
// pin status and warnings: a digest target (a re-worded retry is not recognised), a target
// or probe-argument pointer that names no property of the tool's inputSchema (every call is
// refused unless the upstream accepts undeclared arguments), a pin missing or changed.
func Check(serverID string, pol *Policy, pins *Pins, list []Tool) *Report {
	if pol == nil {
		pol = &Policy{}
	}
	rep := &Report{}
	cat := map[string]toolInfo{}
	var infos []toolInfo
	for _, t := range list {
		info, err := parseTool(t.Definition)
		if err != nil {
			rep.Problems = append(rep.Problems, err.Error())
			continue
		}
		cat[info.Name] = info
		infos = append(infos, info)
	}
	if err := pol.checkCatalog(serverID, cat); err != nil {
		rep.Problems = append(rep.Problems, strings.TrimPrefix(err.Error(), errPolicy+": "))
	}
	if pins != nil && pins.ServerID != serverID {
		rep.Problems = append(rep.Problems, fmt.Sprintf("the pins were locked for server %q, not %q: run toolfence proxy lock", pins.ServerID, serverID))
	}
	for _, info := range infos {
		d := pol.decide(info.Name, &info)
		tr := ToolReport{Name: info.Name, Protect: d.protect, Why: d.why}
		if !d.protect {
			// A pinned tool is checked before it may be bypassed (as the proxy does).
			if _, pinned := pins.pinned(info.Name); pinned && !pol.explicitBypass(info.Name) {
				if tr.Pin = pins.status(info.Name, &info); tr.Pin != "ok" {
					tr.Refused = true
					tr.Warnings = append(tr.Warnings, fmt.Sprintf("pin %s: calls are refused until toolfence proxy lock (or the policy says mode: bypass)", tr.Pin))
				}
			}
			rep.Tools = append(rep.Tools, tr)
			continue
		}
		tr.Target = strings.Join(d.rule.Target, ", ")
		if len(d.rule.Target) == 0 {
			tr.Target = "digest of arguments"
			tr.Warnings = append(tr.Warnings, "no target pointers: the target is a digest of the arguments (a re-worded retry is not recognised as the same call)")
		}
		if miss := info.missingArguments(d.rule); len(miss) > 0 {
			tr.Refused = true
			tr.Warnings = append(tr.Warnings, fmt.Sprintf("pointer(s) %s name no property of the tool's inputSchema: calls without them are refused", strings.Join(miss, ", ")))
		}
		tr.Pin = "no pins"
		if pins != nil {
			tr.Pin = pins.status(info.Name, &info)
			if tr.Pin != "ok" {
				tr.Refused = true
				tr.Warnings = append(tr.Warnings, fmt.Sprintf("pin %s: calls are refused until toolfence proxy lock", tr.Pin))
			}
		}
		rep.Tools = append(rep.Tools, tr)
	}
	return rep
}
