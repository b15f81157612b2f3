package mcpproxy

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolfence/toolfence/jsonptr"
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
		rep := classify(NoEffect{}, &jsonrpc.Response{Result: []byte(c.result)}, nil)
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
	for _, c := range []struct {
		data    string
		outcome residual.State
	}{
		{`{"sent":false,"mark":"` + notSentMark + `"}`, residual.Failed},
		{`{"sent":false}`, residual.Unknown},
		{`{"sent":false,"mark":"forged"}`, residual.Unknown},
		{`{"sent":true}`, residual.Unknown},
	} {
		resp := &jsonrpc.Response{Error: &jsonrpc.Error{Code: CodeUpstreamHTTP, Message: "no answer", Data: []byte(c.data)}}
		if rep := classify(NoEffect{}, resp, nil); rep.Outcome != c.outcome {
			t.Errorf("%s: outcome %s, want %s", c.data, rep.Outcome, c.outcome)
		}
	}
}
