package mcpproxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/internal/testkit/proxyrun"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// The test binary plays these roles, chosen by testkit.RoleEnv (TOOLFENCE_TEST_ROLE): the
// tests (unset), the proxy (a re-exec the host starts over stdio), the upstream fixture (a
// re-exec the proxy starts) and the lock command; httpupstream is chosen in init.
func TestMain(m *testing.M) {
	testkit.RunRole(map[string]func() int{
		"upstream": func() int { runUpstream(); return 0 },
		"proxy":    testkit.RoleFunc("proxy", runProxy),
		"lock":     testkit.RoleFunc("lock", runLock),
	})
	os.Exit(m.Run())
}

// appendIn is the input of the fixture's mutating tools.
type appendIn struct {
	Target string `json:"target"`
	Text   string `json:"text"`
}

// chargeIn is the input of the fixture's charge tool, which deduplicates by key.
type chargeIn struct {
	Target         string `json:"target"`
	Text           string `json:"text"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// runUpstream is an MCP server (official Go SDK) with a tool that appends its effect to
// $TF_EFFECTS (fsynced) and behaves as $TF_MODE's file says: ok, iserror (effect, then an
// isError result), reject (no effect, an isError result "rejected: …"), hang (effect, then
// no answer until cancelled), killparent (effect, then SIGKILL to its parent, the proxy,
// before answering) or task (effect, then an MCP task instead of a result; tasks/get
// answers the status in $TF_TASK's file, tasks/result the result, an isError result
// "rejected: …" for a failed task: raw JSON-RPC, as the SDK has no tasks). Its other tools: note (appends, bypassed by policy in tests), read
// (read-only), find (read-only: whether an effect on a target was written, in
// structuredContent) and charge (appends once per idempotency key, taken from its
// idempotency_key argument or its _meta "example.com/idempotency-key"). $TF_CATALOG's file,
// when it exists, is the description of append (a changed catalog between runs).
func runUpstream() {
	effects, modeFile := os.Getenv("TF_EFFECTS"), os.Getenv("TF_MODE")
	s := mcp.NewServer(&mcp.Implementation{Name: "fixture", Version: "1.0.0"}, nil)
	effect := func(line string) error {
		f, err := os.OpenFile(effects, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := fmt.Fprintln(f, line); err != nil {
			return err
		}
		return f.Sync()
	}
	mode := func() string { m, _ := os.ReadFile(modeFile); return strings.TrimSpace(string(m)) }
	text := func(s string) []mcp.Content { return []mcp.Content{&mcp.TextContent{Text: s}} }
	desc := "Append a line to the effects file."
	if b, err := os.ReadFile(os.Getenv("TF_CATALOG")); err == nil {
		desc = strings.TrimSpace(string(b))
	}
	mcp.AddTool(s, &mcp.Tool{Name: "append", Description: desc},
		func(ctx context.Context, _ *mcp.CallToolRequest, in appendIn) (*mcp.CallToolResult, any, error) {
			switch mode() {
			case "reject":
				return &mcp.CallToolResult{IsError: true, Content: text("rejected: the mailbox is full, nothing was sent")}, nil, nil
			}
			if err := effect("append|" + in.Target + "|" + in.Text); err != nil {
				return nil, nil, err
			}
			switch mode() {
			case "iserror":
				return &mcp.CallToolResult{IsError: true, Content: text("boom after the write")}, nil, nil
			case "hang":
				<-ctx.Done()
				return nil, nil, ctx.Err()
			case "killparent":
				// The proxy dies after the effect and before any answer; so does the fixture.
				_ = syscall.Kill(os.Getppid(), syscall.SIGKILL)
				os.Exit(0)
			}
			return &mcp.CallToolResult{Content: text("appended " + in.Text + " to " + in.Target)}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "note", Description: "Append a note (bypassed by policy in tests)."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in appendIn) (*mcp.CallToolResult, any, error) {
			if err := effect("note|" + in.Target + "|" + in.Text); err != nil {
				return nil, nil, err
			}
			return &mcp.CallToolResult{Content: text("noted")}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "read", Description: "Read the effects file.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, Title: "Read effects"}},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			b, _ := os.ReadFile(effects)
			return &mcp.CallToolResult{Content: text(fmt.Sprintf("%d lines", strings.Count(string(b), "\n")))}, nil, nil
		})
	type findIn struct {
		Target string `json:"target"`
	}
	type findOut struct {
		Found bool `json:"found"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "find", Description: "Whether append wrote an effect on a target.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, _ *mcp.CallToolRequest, in findIn) (*mcp.CallToolResult, findOut, error) {
			b, _ := os.ReadFile(effects)
			return nil, findOut{Found: strings.Contains(string(b), "append|"+in.Target+"|")}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "charge", Description: "Charge once per idempotency key."},
		func(ctx context.Context, req *mcp.CallToolRequest, in chargeIn) (*mcp.CallToolResult, any, error) {
			key := in.IdempotencyKey
			if k, ok := req.Params.Meta["example.com/idempotency-key"].(string); ok {
				key = k
			}
			if key == "" {
				return &mcp.CallToolResult{IsError: true, Content: text("no idempotency key")}, nil, nil
			}
			b, _ := os.ReadFile(effects)
			if !strings.Contains(string(b), "|"+key+"\n") {
				if err := effect("charge|" + in.Target + "|" + in.Text + "|" + key); err != nil {
					return nil, nil, err
				}
				if mode() == "iserror" {
					return &mcp.CallToolResult{IsError: true, Content: text("boom after the charge")}, nil, nil
				}
			}
			return &mcp.CallToolResult{Content: text("charged " + in.Target + " once under " + key)}, nil, nil
		})
	_ = s.Run(context.Background(), &taskTransport{effect: effect, mode: mode})
}

// taskTransport is the fixture's stdio transport, with MCP tasks (2025-11-25) answered as
// raw JSON-RPC in front of the SDK server.
type taskTransport struct {
	effect func(string) error
	mode   func() string
}

func (t *taskTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := (&mcp.StdioTransport{}).Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &taskConn{Connection: c, t: t}, nil
}

// taskConn answers tools/call of append in mode task with a task, and tasks/get and
// tasks/result; everything else goes to the SDK server.
type taskConn struct {
	mcp.Connection
	t *taskTransport
}

func (c *taskConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		msg, err := c.Connection.Read(ctx)
		if err != nil {
			return nil, err
		}
		req, ok := msg.(*jsonrpc.Request)
		if !ok || !req.IsCall() {
			return msg, nil
		}
		var p struct {
			Name      string   `json:"name"`
			Arguments appendIn `json:"arguments"`
			TaskID    string   `json:"taskId"`
		}
		_ = json.Unmarshal(req.Params, &p)
		now := time.Now().UTC().Format(time.RFC3339)
		task := func(status string) map[string]any {
			return map[string]any{"taskId": "task-1", "status": status, "createdAt": now, "lastUpdatedAt": now, "ttl": nil}
		}
		var result any
		switch {
		case req.Method == "tools/call" && p.Name == "append" && c.t.mode() == "task":
			if err := c.t.effect("append|" + p.Arguments.Target + "|" + p.Arguments.Text); err != nil {
				return nil, err
			}
			result = map[string]any{"task": task("working")}
		case req.Method == "tasks/get":
			status, _ := os.ReadFile(os.Getenv("TF_TASK"))
			result = task(strings.TrimSpace(string(status)))
		case req.Method == "tasks/result":
			result = map[string]any{"content": []any{map[string]any{"type": "text", "text": "appended by task " + p.TaskID}}}
			if status, _ := os.ReadFile(os.Getenv("TF_TASK")); strings.TrimSpace(string(status)) == "failed" {
				result = map[string]any{"isError": true, "content": []any{map[string]any{"type": "text", "text": "rejected: the task failed before writing"}}}
			}
		default:
			return msg, nil
		}
		raw, _ := json.Marshal(result)
		if err := c.Connection.Write(ctx, &jsonrpc.Response{ID: req.ID, Result: raw}); err != nil {
			return nil, err
		}
	}
}

// runLock lists the fixture's tools as `toolfence proxy lock` does and writes the pins to
// $TF_PINS.
func runLock() error {
	os.Setenv(testkit.RoleEnv, "upstream")
	up, err := transport.StartUpstream(context.Background(), []string{os.Args[0]}, os.Stderr)
	if err != nil {
		return err
	}
	defer up.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := mcpproxy.ListTools(ctx, up.Conn())
	if err != nil {
		return err
	}
	pins, err := policy.Lock("fixture", list)
	if err != nil {
		return err
	}
	return mcpproxy.WritePins(os.Getenv("TF_PINS"), pins)
}

// runProxy is what `toolfence proxy` does, configured by the environment: the store in
// $TF_STORE, the policy in $TF_POLICY (optional), the upstream the fixture.
func runProxy() error {
	opts := mcpproxy.Options{ServerID: "fixture", Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	var err error
	if path := os.Getenv("TF_POLICY"); path != "" {
		if opts.Policy, err = mcpproxy.LoadPolicy(path); err != nil {
			return err
		}
	}
	if path := os.Getenv("TF_PINS"); path != "" {
		if _, err := os.Stat(path); err == nil {
			if opts.Pins, err = mcpproxy.LoadPins(path); err != nil {
				return err
			}
		}
	}
	return proxyrun.Serve(os.Getenv("TF_STORE"), interceptor.Options{LeaseTTL: 5 * time.Second}, opts, "upstream")
}
