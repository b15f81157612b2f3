package mcpfixture

import (
	"context"
	"errors"
	"net/http"
	"os"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// RunMCPGo serves the fixture's tools (append, note, read), resource (ResourceURI) and
// prompt (PromptName) over stdin/stdout with mcp-go until the client hangs up (nil) or the
// transport fails (its error). Its append also accepts task-augmented calls (MCP Tasks):
// such a call is answered at once with a task (CreateTaskResult) and runs in the background.
func RunMCPGo(ctx context.Context) error {
	err := server.NewStdioServer(newMCPGo()).Listen(ctx, os.Stdin, os.Stdout)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// MCPGoHandler returns the same server as RunMCPGo as mcp-go's streamable-HTTP handler,
// serving the MCP endpoint at /mcp.
func MCPGoHandler() http.Handler { return server.NewStreamableHTTPServer(newMCPGo()) }

func newMCPGo() *server.MCPServer {
	s := server.NewMCPServer("mcpfx-mcpgo", "1.0.0", server.WithToolCapabilities(false),
		server.WithResourceCapabilities(false, false), server.WithPromptCapabilities(false),
		server.WithTaskCapabilities(true, true, true))
	handler := func(tool string) server.ToolHandlerFunc {
		return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var in Input
			if err := req.BindArguments(&in); err != nil {
				return mcp.NewToolResultError("invalid arguments: " + err.Error()), nil
			}
			var meta map[string]any
			var token mcp.ProgressToken
			if req.Params.Meta != nil {
				meta, token = req.Params.Meta.AdditionalFields, req.Params.Meta.ProgressToken
			}
			mode := modeOf(meta)
			if mode == ModeInvalid {
				mode = ModeReject
			}
			a, err := run(ctx, tool, in, mode)
			if err != nil {
				return nil, err
			}
			if token != nil {
				srv := server.ServerFromContext(ctx)
				for _, p := range a.progress {
					if err := srv.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
						"progressToken": token, "progress": p.progress, "total": p.total, "message": p.message}); err != nil {
						return nil, err
					}
				}
			}
			if a.isError {
				return mcp.NewToolResultError(a.text), nil
			}
			return mcp.NewToolResultText(a.text), nil
		}
	}
	s.AddTool(mcp.NewTool(ToolAppend,
		mcp.WithDescription(appendDescription()),
		mcp.WithString("target", mcp.Required(), mcp.Description("where the line goes, e.g. inbox:bob")),
		mcp.WithString("text", mcp.Required(), mcp.Description("the line to append")),
		mcp.WithNumber("priority", mcp.Description("0 (default) to 9")),
		mcp.WithTitleAnnotation("Append a line"),
		mcp.WithDestructiveHintAnnotation(true),
		mcp.WithTaskSupport(mcp.TaskSupportOptional),
	), handler(ToolAppend))
	s.AddTool(mcp.NewTool(ToolNote,
		mcp.WithDescription("Append a note (bypassed by policy in tests)."),
		mcp.WithString("target", mcp.Required()),
		mcp.WithString("text", mcp.Required()),
		// mcp-go marks every tool destructive unless told otherwise, and a destructive tool
		// cannot be bypassed by policy: say it is not.
		mcp.WithDestructiveHintAnnotation(false),
	), handler(ToolNote))
	s.AddTool(mcp.NewTool(ToolRead,
		mcp.WithDescription("Count the effects so far."),
		mcp.WithTitleAnnotation("Read effects"),
		mcp.WithReadOnlyHintAnnotation(true),
	), handler(ToolRead))
	s.AddTool(mcp.NewTool(ToolFind,
		mcp.WithDescription("Whether append's effect for target and text happened."),
		mcp.WithString("target", mcp.Required()),
		mcp.WithString("text", mcp.Required()),
		mcp.WithTitleAnnotation("Find an effect"),
		mcp.WithReadOnlyHintAnnotation(true),
		mcp.WithDestructiveHintAnnotation(false),
	), handler(ToolFind))
	s.AddResource(mcp.NewResource(ResourceURI, "about", mcp.WithMIMEType("text/plain")),
		func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: ResourceURI, MIMEType: "text/plain", Text: ResourceText}}, nil
		})
	s.AddPrompt(mcp.NewPrompt(PromptName, mcp.WithPromptDescription("Greet someone."),
		mcp.WithArgument("who", mcp.ArgumentDescription("whom to greet"), mcp.RequiredArgument())),
		func(_ context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return &mcp.GetPromptResult{Messages: []mcp.PromptMessage{
				mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent("Say hello to "+req.Params.Arguments["who"]+"."))}}, nil
		})
	return s
}
