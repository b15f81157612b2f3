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
