package interop_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	mcpgoclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/internal/testkit/npmci"
)

// host is an MCP client as users run them, connected over stdio to a command.
type host interface {
	// tools is the tool list as the host parsed it, marshalled back to JSON.
	tools(t *testing.T) []byte
	// call makes one tools/call and returns its result; it fails the test on a protocol error.
	call(t *testing.T, name string, args, meta map[string]any) outcome
	close() error
}

// hostKinds are the hosts with a live session (the TypeScript host runs as a script).
var hostKinds = map[string]func(w *world, argv []string) host{
	"gosdk": func(w *world, argv []string) host { return w.goSDK(argv) },
	"mcpgo": func(w *world, argv []string) host { return w.mcpGo(argv) },
}

// goHost is a host on the official Go SDK client; progress gets the progress
// notifications it receives.
type goHost struct {
	s        *mcp.ClientSession
	progress chan *mcp.ProgressNotificationParams
}

// goSDK starts argv under an official Go SDK client (CommandTransport) and initializes.
func (w *world) goSDK(argv []string) *goHost {
	w.t.Helper()
	return w.goSDKCmd(exec.Command(argv[0], argv[1:]...))
}

// goSDKCmd is goSDK for a command of the caller's (started here, with the world's env).
func (w *world) goSDKCmd(cmd *exec.Cmd) *goHost {
	w.t.Helper()
	return w.goSDKWith(cmd, nil)
}

// goSDKElicit is goSDK for a host whose user answers elicitations with elicit.
func (w *world) goSDKElicit(argv []string, elicit func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)) *goHost {
	w.t.Helper()
	return w.goSDKWith(exec.Command(argv[0], argv[1:]...), elicit)
}

// goSDKWith is goSDKCmd with an elicitation handler (nil: none, the capability undeclared).
func (w *world) goSDKWith(cmd *exec.Cmd, elicit func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)) *goHost {
	w.t.Helper()
	h := &goHost{progress: make(chan *mcp.ProgressNotificationParams, 16)}
	cmd.Env, cmd.Stderr = w.env(), w.stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-host", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) { h.progress <- r.Params },
		ElicitationHandler:          elicit,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(w.t, err, "stderr:\n%s", w.stderr)
	h.s = s
	w.t.Cleanup(func() { _ = s.Close() })
	return h
}

func (h *goHost) tools(t *testing.T) []byte {
	t.Helper()
	res, err := h.s.ListTools(t.Context(), nil)
	require.NoError(t, err)
	b, err := json.Marshal(res.Tools)
	require.NoError(t, err)
	return b
}

func (h *goHost) call(t *testing.T, name string, args, meta map[string]any) outcome {
	t.Helper()
	res, err := h.callErr(t.Context(), name, args, meta)
	require.NoError(t, err)
	return res
}

// callErr makes one tools/call and returns its result or the protocol error.
func (h *goHost) callErr(ctx context.Context, name string, args, meta map[string]any) (outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := h.s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args, Meta: meta})
	if err != nil {
		return outcome{}, err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return outcome{}, err
	}
	return decodeOutcome(b)
}

func (h *goHost) close() error { return h.s.Close() }

// mcpGoHost is a host on mark3labs/mcp-go's stdio client.
type mcpGoHost struct{ c *mcpgoclient.Client }

// mcpGo starts argv under an mcp-go stdio client and initializes.
func (w *world) mcpGo(argv []string) *mcpGoHost {
	w.t.Helper()
	tr := transport.NewStdioWithOptions(argv[0], w.env(), argv[1:], transport.WithCommandStderrWriter(w.stderr))
	require.NoError(w.t, tr.Start(context.Background()))
	c := mcpgoclient.NewClient(tr)
	w.t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.Initialize(ctx, mcpgo.InitializeRequest{Params: mcpgo.InitializeParams{
		ProtocolVersion: mcpgo.LATEST_PROTOCOL_VERSION, ClientInfo: mcpgo.Implementation{Name: "mcp-go-host", Version: "1"}}})
	require.NoError(w.t, err, "stderr:\n%s", w.stderr)
	return &mcpGoHost{c: c}
}

func (h *mcpGoHost) tools(t *testing.T) []byte {
	t.Helper()
	res, err := h.c.ListTools(t.Context(), mcpgo.ListToolsRequest{})
	require.NoError(t, err)
	b, err := json.Marshal(res.Tools)
	require.NoError(t, err)
	return b
}

func (h *mcpGoHost) call(t *testing.T, name string, args, meta map[string]any) outcome {
	t.Helper()
	req := mcpgo.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	if meta != nil {
		req.Params.Meta = &mcpgo.Meta{AdditionalFields: meta}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := h.c.CallTool(ctx, req)
	require.NoError(t, err)
	b, err := json.Marshal(res)
	require.NoError(t, err)
	return parseOutcome(t, b)
}

func (h *mcpGoHost) close() error { return h.c.Close() }

// rawRequest is one request of rawSession: a method and its params (JSON).
type rawRequest struct{ method, params string }

// rawSession speaks JSON-RPC to argv by hand: initialize, notifications/initialized, then
// each request in turn. It returns the bytes of each result exactly as they came on the
// wire, the initialize result first.
func (w *world) rawSession(argv []string, reqs ...rawRequest) [][]byte {
	w.t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Stderr = w.env(), w.stderr
	in, err := cmd.StdinPipe()
	require.NoError(w.t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(w.t, err)
	require.NoError(w.t, cmd.Start())
	defer func() {
		_ = in.Close()
		_ = cmd.Wait()
	}()
	r := bufio.NewReader(out)
	read := func(id int) []byte {
		for {
			line, err := r.ReadBytes('\n')
			require.NoError(w.t, err, "stderr:\n%s", w.stderr)
			var msg struct {
				ID     *int            `json:"id"`
				Result json.RawMessage `json:"result"`
				Error  json.RawMessage `json:"error"`
			}
			require.NoError(w.t, json.Unmarshal(line, &msg), "line %s", line)
			if msg.ID != nil && *msg.ID == id {
				require.Nil(w.t, msg.Error, "line %s", line)
				return msg.Result
			}
		}
	}
	_, err = io.WriteString(in, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw-host","version":"1"}}}`+"\n")
	require.NoError(w.t, err)
	results := [][]byte{read(0)}
	_, err = io.WriteString(in, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
	require.NoError(w.t, err)
	for i, req := range reqs {
		_, err = fmt.Fprintf(in, `{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`+"\n", i+1, req.method, req.params)
		require.NoError(w.t, err)
		results = append(results, read(i+1))
	}
	return results
}

// The TypeScript host: internal/fixture/testdata/tsclient/host.mjs on the official TypeScript SDK.

// tsHostDir is the Node project of the TypeScript SDK host; its package-lock.json pins
// @modelcontextprotocol/sdk, and `npm ci` installs it there.
const tsHostDir = "../../internal/fixture/testdata/tsclient"

// installStamp, inside node_modules, holds the SHA-256 of the package.json and
// package-lock.json node_modules was installed from, so later runs skip `npm ci`.
// node returns the node binary once node_modules of tsHostDir is installed (`npm ci` at
// most once per test binary, and only when the lock changed; cached tarballs are not
// downloaded again). Without node or npm the test fails: the matrix needs the host.
func node(t *testing.T) string {
	t.Helper()
	testkit.SkipShort(t, "needs node and npm (the TypeScript SDK)")
	nodeBin, errNode := exec.LookPath("node")
	npm, errNpm := exec.LookPath("npm")
	require.NoError(t, errors.Join(errNode, errNpm), "the TypeScript SDK host needs node and npm on PATH (Debian: apt-get install nodejs npm)")
	require.NoError(t, npmci.Install(npm, tsHostDir))
	return nodeBin
}

// tsCall is one call host.mjs makes.
type tsCall struct {
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
	Meta      map[string]any `json:"_meta,omitempty"`
}

// tsRun runs host.mjs against argv (over stdio): it lists the tools and makes calls in
// order. It returns the tool list (JSON, as the TypeScript SDK parsed it) and the results.
func (w *world) tsRun(nodeBin string, argv []string, calls []tsCall) ([]byte, []outcome) {
	w.t.Helper()
	spec := w.tsStdio(argv)
	spec["calls"] = calls
	return w.tsJob(nodeBin, spec)
}

// tsStdio is the part of a host.mjs job that runs argv over stdio in the world's
// environment; the caller adds the calls and the rest.
func (w *world) tsStdio(argv []string) map[string]any {
	env := map[string]string{}
	for _, kv := range w.env() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return map[string]any{"command": argv[0], "args": argv[1:], "env": env}
}

// tsRunHTTP is tsRun over streamable HTTP to url with a bearer token.
func (w *world) tsRunHTTP(nodeBin, url, token string, calls []tsCall) ([]byte, []outcome) {
	w.t.Helper()
	return w.tsJob(nodeBin, map[string]any{"url": url, "token": token, "calls": calls})
}

func (w *world) tsJob(nodeBin string, spec map[string]any) ([]byte, []outcome) {
	w.t.Helper()
	tools, outs, _ := w.tsJobAsked(nodeBin, spec)
	return tools, outs
}

// tsJobAsked is tsJob that also returns the messages of the elicitations the host answered
// (spec "elicit": the answers, in order).
func (w *world) tsJobAsked(nodeBin string, spec map[string]any) ([]byte, []outcome, []string) {
	w.t.Helper()
	job, err := json.Marshal(spec)
	require.NoError(w.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBin, "host.mjs", string(job))
	cmd.Dir = tsHostDir
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, w.stderr
	runErr := cmd.Run()
	var rep struct {
		Step    string            `json:"step"`
		Error   string            `json:"error"`
		Tools   json.RawMessage   `json:"tools"`
		Results []json.RawMessage `json:"results"`
		Asked   []string          `json:"asked"`
	}
	require.NoError(w.t, json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &rep), "host.mjs printed no report (%v)\nstdout: %s\nstderr: %s", runErr, stdout.String(), w.stderr)
	require.Empty(w.t, rep.Error, "TypeScript SDK host failed at %s\nstderr: %s", rep.Step, w.stderr)
	require.NoError(w.t, runErr)
	var outs []outcome
	for _, r := range rep.Results {
		outs = append(outs, parseOutcome(w.t, r))
	}
	return rep.Tools, outs, rep.Asked
}

// callTask makes a task-augmented tools/call (params.task) and returns its result.
func (h *mcpGoHost) callTask(t *testing.T, name string, args, meta map[string]any) outcome {
	t.Helper()
	req := mcpgo.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	if meta != nil {
		req.Params.Meta = &mcpgo.Meta{AdditionalFields: meta}
	}
	req.Params.Task = &mcpgo.TaskParams{}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := h.c.CallTool(ctx, req)
	require.NoError(t, err)
	b, err := json.Marshal(res)
	require.NoError(t, err)
	return parseOutcome(t, b)
}
