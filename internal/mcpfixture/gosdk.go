package mcpfixture

import (
	"context"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// RunGoSDK serves the fixture's tools (append, note, read), resource (ResourceURI) and
// prompt (PromptName) over stdin/stdout with the official Go SDK until the client hangs up
// (nil) or the transport fails (its error).
func RunGoSDK(ctx context.Context) error { return newGoSDK().Run(ctx, &mcp.StdioTransport{}) }

// GoSDKHandler returns the same server as RunGoSDK as a streamable-HTTP handler (the
// official Go SDK's), to be mounted at the MCP endpoint (e.g. /mcp).
func GoSDKHandler() http.Handler {
	s := newGoSDK()
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
}

func newGoSDK() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "mcpfx-gosdk", Version: "1.0.0"}, nil)
	yes := true
	handler := func(tool string) mcp.ToolHandlerFor[Input, any] {
		return func(ctx context.Context, req *mcp.CallToolRequest, in Input) (*mcp.CallToolResult, any, error) {
			a, err := run(ctx, tool, in, modeOf(req.Params.Meta))
			if err != nil {
				return nil, nil, err
			}
			if a.rpcCode != 0 {
				return nil, nil, &jsonrpc.Error{Code: a.rpcCode, Message: a.text}
			}
			if tok := req.Params.GetProgressToken(); tok != nil {
				for _, p := range a.progress {
					if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
						ProgressToken: tok, Progress: p.progress, Total: p.total, Message: p.message}); err != nil {
						return nil, nil, err
					}
				}
			}
			return &mcp.CallToolResult{IsError: a.isError, Content: []mcp.Content{&mcp.TextContent{Text: a.text}}}, nil, nil
		}
	}
	mcp.AddTool(s, &mcp.Tool{Name: ToolAppend, Description: appendDescription(),
		Annotations: &mcp.ToolAnnotations{Title: "Append a line", DestructiveHint: &yes}}, handler(ToolAppend))
	mcp.AddTool(s, &mcp.Tool{Name: ToolNote, Description: "Append a note (bypassed by policy in tests)."}, handler(ToolNote))
	mcp.AddTool(s, &mcp.Tool{Name: ToolRead, Description: "Count the effects so far.",
		Annotations: &mcp.ToolAnnotations{Title: "Read effects", ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			a, err := run(ctx, ToolRead, Input{}, ModeOK)
			if err != nil {
				return nil, nil, err
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.text}}}, nil, nil
		})
	type found struct {
		Found bool `json:"found"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: ToolFind, Description: "Whether append's effect for target and text happened.",
		Annotations: &mcp.ToolAnnotations{Title: "Find an effect", ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, in Input) (*mcp.CallToolResult, found, error) {
			a, err := run(ctx, ToolFind, in, ModeOK)
			return nil, found{a.found}, err
		})
	s.AddResource(&mcp.Resource{URI: ResourceURI, Name: "about", MIMEType: "text/plain"},
		func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: ResourceURI, MIMEType: "text/plain", Text: ResourceText}}}, nil
		})
	s.AddPrompt(&mcp.Prompt{Name: PromptName, Description: "Greet someone.",
		Arguments: []*mcp.PromptArgument{{Name: "who", Description: "whom to greet", Required: true}}},
		func(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user",
				Content: &mcp.TextContent{Text: "Say hello to " + req.Params.Arguments["who"] + "."}}}}, nil
		})
	return s
}
