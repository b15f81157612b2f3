package mcpproxy

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/jsonptr"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
	"github.com/toolfence/toolfence/residual"
)

// TestClassifyTaskResultIsAccepted: an upstream that answers tools/call with an MCP task
// (the call is only queued) is recorded as accepted with the task id as handle, never as
// succeeded (docs/design.md: a queued answer is not a success); a task without an id is unknown.
func TestClassifyTaskResultIsAccepted(t *testing.T) {
	for _, c := range []struct {
		result  string
		outcome residual.State
		handle  string
	}{
		{`{"task":{"taskId":"t-1","status":"working"}}`, residual.Accepted, "t-1"},
		{`{"task":{"status":"working"}}`, residual.Unknown, ""},
		{`{"content":[{"type":"text","text":"done"}]}`, residual.Succeeded, ""},
	} {
		rep := classify(policy.NoEffect{}, &jsonrpc.Response{Result: []byte(c.result)}, nil)
		if rep.Outcome != c.outcome || rep.Handle != c.handle {
			t.Errorf("%s: outcome %s handle %q, want %s %q", c.result, rep.Outcome, rep.Handle, c.outcome, c.handle)
		}
	}
}

// TestTruthyFoundValues: what a probe's found value means (the probe rules of docs/proxy.md):
// a value JSON counts as false (false, null, "", 0, [], {}) means not found, anything else found.
func TestTruthyFoundValues(t *testing.T) {
	for _, c := range []struct {
		doc  string
		want bool
	}{
		{`true`, true}, {`"ch_1"`, true}, {`1`, true}, {`0.5`, true}, {`[1]`, true}, {`{"id": 1}`, true},
		{`false`, false}, {`null`, false}, {`""`, false}, {`0`, false}, {`0.0`, false}, {`[]`, false}, {`{}`, false},
	} {
		v, ok, err := jsonptr.Lookup("", []byte(c.doc))
		if err != nil || !ok {
			t.Fatalf("%s: %v", c.doc, err)
		}
		if got := truthy(v); got != c.want {
			t.Errorf("found %s: truthy %v, want %v", c.doc, got, c.want)
		}
	}
}

// TestClassifyUnreachableHTTPUpstreamIsFailed: the proxy's own answer for a request it could
// not send to an HTTP upstream (connection refused) records failed, so a retry dispatches;
// the same answer made by an upstream (without this process's mark), or one that was sent,
// stays unknown.
func TestClassifyUnreachableHTTPUpstreamIsFailed(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close() // nothing listens there now
	conn, err := transport.DialUpstream(context.Background(), srv.URL, nil)
	require.NoError(t, err)
	defer conn.Close()
	id, _ := jsonrpc.MakeID(float64(1))
	require.NoError(t, conn.Write(context.Background(), &jsonrpc.Request{ID: id, Method: "tools/call", Params: json.RawMessage(`{}`)}))
	msg, err := conn.Read(context.Background())
	require.NoError(t, err)
	own := msg.(*jsonrpc.Response)
	if rep := classify(policy.NoEffect{}, own, nil); rep.Outcome != residual.Failed {
		t.Errorf("the proxy's own not-sent answer: outcome %s, want failed", rep.Outcome)
	}
	for _, data := range []string{`{"sent":false}`, `{"sent":false,"mark":"forged"}`, `{"sent":true}`} {
		resp := &jsonrpc.Response{Error: &jsonrpc.Error{Code: transport.CodeUpstreamHTTP, Message: "no answer", Data: []byte(data)}}
		if rep := classify(policy.NoEffect{}, resp, nil); rep.Outcome != residual.Unknown {
			t.Errorf("%s: outcome %s, want unknown", data, rep.Outcome)
		}
	}
}

// TestClassifyOutputRefusalMayHaveActed: the TypeScript SDK's answers for a tool whose output
// breaks its outputSchema come after the tool ran, with the invalid-params code: unknown,
// as an isError result (SDK 1.23 and later) and as a JSON-RPC -32602 error (before 1.23). Its
// refusals of arguments and unknown tools stay failed.
func TestClassifyOutputRefusalMayHaveActed(t *testing.T) {
	isError := func(text string) *jsonrpc.Response {
		b, _ := json.Marshal(map[string]any{"isError": true, "content": []any{map[string]any{"type": "text", "text": text}}})
		return &jsonrpc.Response{Result: b}
	}
	rpcError := func(msg string) *jsonrpc.Response {
		return &jsonrpc.Response{Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: msg}}
	}
	for _, c := range []struct {
		name string
		resp *jsonrpc.Response
		want residual.State
	}{
		{"isError output invalid", isError("MCP error -32602: Output validation error: Invalid structured content for tool record: expected string at id"), residual.Unknown},
		{"isError output missing", isError("MCP error -32602: Output validation error: Tool record has an output schema but no structured content was provided"), residual.Unknown},
		{"-32602 output missing", rpcError("Tool record has an output schema but no structured content was provided"), residual.Unknown},
		{"-32602 output invalid", rpcError("Invalid structured content for tool record: Expected string, received number"), residual.Unknown},
		{"isError input invalid", isError("MCP error -32602: Input validation error: Invalid arguments for tool record: Required"), residual.Failed},
		{"isError unknown tool", isError("MCP error -32602: Tool recrod not found"), residual.Failed},
		{"-32602 input invalid", rpcError("Invalid arguments for tool record: Required"), residual.Failed},
	} {
		if rep := classify(policy.NoEffect{}, c.resp, nil); rep.Outcome != c.want {
			t.Errorf("%s: outcome %s, want %s (%s)", c.name, rep.Outcome, c.want, rep.Error)
		}
	}
}
