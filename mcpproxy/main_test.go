package mcpproxy_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpproxy"
)

// The test binary plays three roles, chosen by TF_ROLE: the tests (unset), the proxy
// (a re-exec the host starts over stdio) and the upstream fixture (a re-exec the proxy starts).
func TestMain(m *testing.M) {
	switch os.Getenv("TF_ROLE") {
	case "upstream":
		runUpstream()
		os.Exit(0)
	case "proxy":
		if err := runProxy(); err != nil {
			fmt.Fprintln(os.Stderr, "proxy:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// appendIn is the input of the fixture's mutating tools.
type appendIn struct {
	Target string `json:"target"`
	Text   string `json:"text"`
}

// runUpstream is an MCP server (official Go SDK) with a tool that appends its effect to
// $TF_EFFECTS (fsynced) and behaves as $TF_MODE's file says: ok, iserror (effect, then an
// isError result), reject (no effect, an isError result "rejected: …") or hang (effect,
// then no answer until cancelled).
func runUpstream() {
	effects, modeFile := os.Getenv("TF_EFFECTS"), os.Getenv("TF_MODE")
	s := mcp.NewServer(&mcp.Implementation{Name: "fixture", Version: "1.0.0"}, nil)
	effect := func(tool string, in appendIn) error {
		f, err := os.OpenFile(effects, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := fmt.Fprintf(f, "%s|%s|%s\n", tool, in.Target, in.Text); err != nil {
			return err
		}
		return f.Sync()
	}
	text := func(s string) []mcp.Content { return []mcp.Content{&mcp.TextContent{Text: s}} }
	mcp.AddTool(s, &mcp.Tool{Name: "append", Description: "Append a line to the effects file."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in appendIn) (*mcp.CallToolResult, any, error) {
			mode, _ := os.ReadFile(modeFile)
			switch strings.TrimSpace(string(mode)) {
			case "reject":
				return &mcp.CallToolResult{IsError: true, Content: text("rejected: the mailbox is full, nothing was sent")}, nil, nil
			}
			if err := effect("append", in); err != nil {
				return nil, nil, err
			}
			switch strings.TrimSpace(string(mode)) {
			case "iserror":
				return &mcp.CallToolResult{IsError: true, Content: text("boom after the write")}, nil, nil
			case "hang":
				<-ctx.Done()
				return nil, nil, ctx.Err()
			}
			return &mcp.CallToolResult{Content: text("appended " + in.Text + " to " + in.Target)}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "note", Description: "Append a note (bypassed by policy in tests)."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in appendIn) (*mcp.CallToolResult, any, error) {
			if err := effect("note", in); err != nil {
				return nil, nil, err
			}
			return &mcp.CallToolResult{Content: text("noted")}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "read", Description: "Read the effects file.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, Title: "Read effects"}},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			b, _ := os.ReadFile(effects)
			return &mcp.CallToolResult{Content: text(fmt.Sprintf("%d lines", strings.Count(string(b), "\n")))}, nil, nil
		})
	_ = s.Run(context.Background(), &mcp.StdioTransport{})
}

// runProxy is what `toolfence proxy` does, configured by the environment: the store in
// $TF_STORE, the policy in $TF_POLICY (optional), the upstream the fixture.
func runProxy() error {
	l, err := badger.Open(os.Getenv("TF_STORE"), badger.Options{})
	if err != nil {
		return err
	}
	defer l.Close()
	ic, err := interceptor.New(l, interceptor.Options{LeaseTTL: 5 * time.Second})
	if err != nil {
		return err
	}
	cfg := mcpproxy.Options{ServerID: "fixture", Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	if path := os.Getenv("TF_POLICY"); path != "" {
		if cfg.Policy, err = mcpproxy.LoadPolicy(path); err != nil {
			return err
		}
	}
	p, err := mcpproxy.New(ic, cfg)
	if err != nil {
		return err
	}
	os.Setenv("TF_ROLE", "upstream")
	up, err := mcpproxy.StartUpstream(context.Background(), []string{os.Args[0]}, os.Stderr)
	if err != nil {
		return err
	}
	defer up.Close()
	return p.Serve(context.Background(), mcpproxy.Stdio(os.Stdin, os.Stdout), up.Conn())
}
