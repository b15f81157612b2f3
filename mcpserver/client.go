package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// ErrInternal is what a ToolError of kind internal unwraps to: the server failed (a bug).
// The other kinds unwrap to the sentinel of their concept (see ToolError).
var ErrInternal = errors.New("mcpserver: internal server error")

var kindSentinels = map[mcpwire.Kind]error{
	mcpwire.KindInvalidInput: interceptor.ErrInvalidCall, mcpwire.KindNotFound: residual.ErrNotFound, mcpwire.KindLeaseLost: residual.ErrLeaseLost,
	mcpwire.KindRefused: interceptor.ErrClaimRefused, mcpwire.KindInProgress: residual.ErrInProgress, mcpwire.KindInvalidTransition: residual.ErrInvalidTransition,
	mcpwire.KindUnavailable: ledger.ErrUnavailable, mcpwire.KindInternal: ErrInternal,
}

// ToolError is an isError result of a tool, as Client returns it. errors.Is matches the
// sentinel of its kind: residual.ErrNotFound, residual.ErrLeaseLost, residual.ErrInProgress,
// residual.ErrInvalidTransition, interceptor.ErrInvalidCall (the server refused the
// arguments; nothing was written), interceptor.ErrClaimRefused (the server refused the
// claimed outcome, e.g. success for a queued answer), ledger.ErrUnavailable (the server's
// ledger failed) or ErrInternal.
type ToolError struct {
	Tool string
	Info mcpwire.ErrorInfo
}

// Error returns the server's text: tool, kind, message and recovery.
func (e *ToolError) Error() string {
	s := fmt.Sprintf("%s: %s: %s", e.Tool, e.Info.Kind, e.Info.Message)
	if e.Info.Recovery != "" {
		s += "; recovery: " + e.Info.Recovery
	}
	return s
}

// Unwrap returns the sentinel of the error's kind, or nil for an unknown kind.
func (e *ToolError) Unwrap() error { return kindSentinels[e.Info.Kind] }

// Client calls the tools of a toolfence MCP server over streamable HTTP. It is what the CLI
// uses to act through `toolfence serve` while the server holds the embedded store. It is
// safe for concurrent use; Close releases it.
type Client struct {
	c *client.Client
}

// Dial connects to the toolfence MCP server at rawURL ("http://127.0.0.1:7777" or the
// endpoint itself, ".../mcp") with a bearer token (empty for a loopback server without
// tokens). It returns an error wrapping ledger.ErrUnauthorized when the server refuses the token,
// and the transport's error when it cannot connect.
func Dial(ctx context.Context, rawURL, token string) (*Client, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("mcpserver: server URL %q: want http://HOST:PORT[/mcp]", rawURL)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = mcpwire.Path
	}
	hc := &http.Client{Transport: bearerTransport{token: token, next: http.DefaultTransport}}
	tr, err := transport.NewStreamableHTTP(u.String(), transport.WithHTTPBasicClient(hc))
	if err != nil {
		return nil, fmt.Errorf("mcpserver: %w", err)
	}
	c := client.NewClient(tr)
	if err := c.Start(ctx); err != nil {
		return nil, fmt.Errorf("mcpserver: connecting to %s: %w", u, err)
	}
	var init mcp.InitializeRequest
	init.Params.ClientInfo = mcp.Implementation{Name: "toolfence-cli", Version: "dev"}
	if _, err := c.Initialize(ctx, init); err != nil {
		c.Close()
		if errors.Is(err, transport.ErrAuthorizationRequired) || errors.Is(err, transport.ErrUnauthorized) {
			return nil, fmt.Errorf("mcpserver: %s refused the bearer token: %w", u, ledger.ErrUnauthorized)
		}
		return nil, fmt.Errorf("mcpserver: connecting to %s: %w", u, err)
	}
	return &Client{c: c}, nil
}

type bearerTransport struct {
	token string
	next  http.RoundTripper
}

// RoundTrip sends r with the bearer token set (unless the token is empty).
func (t bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.token == "" {
		return t.next.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.next.RoundTrip(r)
}

// Close ends the connection.
func (c *Client) Close() error { return c.c.Close() }

// Call calls tool with in as arguments and decodes its structured result into out (which
// may be nil). An isError result is returned as a *ToolError; protocol and transport
// failures as other errors (wrapping ledger.ErrUnauthorized for 401).
func (c *Client) Call(ctx context.Context, tool string, in, out any) error {
	var req mcp.CallToolRequest
	req.Params.Name = tool
	req.Params.Arguments = in
	res, err := c.c.CallTool(ctx, req)
	if err != nil {
		if errors.Is(err, transport.ErrAuthorizationRequired) || errors.Is(err, transport.ErrUnauthorized) {
			return fmt.Errorf("mcpserver: %s: the server refused the bearer token: %w", tool, ledger.ErrUnauthorized)
		}
		return fmt.Errorf("mcpserver: %s: %w", tool, err)
	}
	raw := res.RawStructuredContent
	if len(raw) == 0 && res.StructuredContent != nil {
		if raw, err = json.Marshal(res.StructuredContent); err != nil {
			return fmt.Errorf("mcpserver: %s: %w", tool, err)
		}
	}
	if res.IsError {
		var wrapped struct {
			Error mcpwire.ErrorInfo `json:"error"`
		}
		if len(raw) == 0 || json.Unmarshal(raw, &wrapped) != nil || wrapped.Error.Kind == "" {
			return &ToolError{Tool: tool, Info: mcpwire.ErrorInfo{Kind: mcpwire.KindInternal, Message: resultText(res)}}
		}
		return &ToolError{Tool: tool, Info: wrapped.Error}
	}
	if out == nil {
		return nil
	}
	if len(raw) == 0 {
		return fmt.Errorf("mcpserver: %s returned no structured content: %s", tool, resultText(res))
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("mcpserver: %s: decoding result: %w", tool, err)
	}
	return nil
}

func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := mcp.AsTextContent(c); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// List returns one page of open residuals (list_pending).
func (c *Client) List(ctx context.Context, in ListPendingInput) (*ListResult, error) {
	var out ListResult
	if err := c.Call(ctx, ToolListPending, in, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Inspect returns one residual whole (inspect_residual). A missing key gives a *ToolError
// matching residual.ErrNotFound.
func (c *Client) Inspect(ctx context.Context, key string) (*ResidualView, error) {
	var out ResidualView
	if err := c.Call(ctx, ToolInspect, InspectInput{Key: key}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Resolve settles an unknown or accepted residual (resolve_residual).
func (c *Client) Resolve(ctx context.Context, in ResolveInput) (*ResolveResult, error) {
	var out ResolveResult
	if err := c.Call(ctx, ToolResolve, in, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
