package mcpproxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
	"github.com/toolfence/toolfence/residual"
)

// How the proxy reads an answer of a protected call: the outcome it records (classify) and
// the refusals of MCP SDKs that prove the tool never ran.

// classify maps upstream's answer to a claimed outcome, failing toward unknown. By resultType
// first (SEP-2322; absent before 2026-07-28: complete): "task" (a tasks-extension
// CreateTaskResult, or a 2025-11-25 task result: the call was only queued) → accepted with
// the task id as handle, never succeeded; "input_required" (an answer that could not be a
// round) or a resultType the proxy does not know → unknown. A complete result with isError
// false → succeeded; isError true → unknown, unless its first text block is an MCP SDK's
// refusal (sdkRefusals) or a no_effect pattern matches its text (failed). A JSON-RPC error
// that says the request was refused before it ran (refusedBeforeRunning: method not found,
// invalid params but an SDK's refusal of a tool's output, outputRefused), a no_effect code,
// or an HTTP upstream the proxy could not connect to (nothing sent) → failed; any other
// error, no answer, a timeout or a cancellation → unknown.
func classify(rule policy.NoEffect, resp *jsonrpc.Response, callErr error) interceptor.Report {
	if resp == nil {
		return interceptor.Report{Outcome: residual.Unknown, Error: fmt.Sprintf("no answer from upstream: %v", callErr)}
	}
	if resp.Error != nil {
		var we *jsonrpc.Error
		body, _ := json.Marshal(resp.Error)
		rep := interceptor.Report{Outcome: residual.Unknown, Body: body, Error: resp.Error.Error()}
		if errors.As(resp.Error, &we) {
			rep.Error = fmt.Sprintf("JSON-RPC error %d: %s", we.Code, we.Message)
			switch {
			case we.Code == jsonrpc.CodeInvalidParams && outputRefused(we.Message):
				// The tool ran; the SDK refused what it returned.
			case we.Code == jsonrpc.CodeMethodNotFound || we.Code == jsonrpc.CodeInvalidParams || rule.HasCode(we.Code),
				refusedBeforeRunning(we.Code):
				rep.Outcome = residual.Failed
			case transport.NotSent(we):
				rep.Outcome = residual.Failed
				rep.Error = "the HTTP upstream could not be reached, nothing was sent: " + we.Message
			}
		}
		return rep
	}
	switch rt, ok := transport.ResultType(resp.Result); {
	case !ok:
		return interceptor.Report{Outcome: residual.Unknown, Body: resp.Result, Error: "upstream's result is not a tool result: its resultType is not a string"}
	case rt == resultTask:
		// The tasks extension of 2026-07-28: a flat CreateTaskResult, the call queued upstream.
		var task struct {
			TaskID string `json:"taskId"`
		}
		if json.Unmarshal(resp.Result, &task) != nil || task.TaskID == "" {
			return interceptor.Report{Outcome: residual.Unknown, Body: resp.Result, Error: "upstream queued the call as a task without a taskId"}
		}
		return interceptor.Report{Outcome: residual.Accepted, Body: resp.Result, Handle: task.TaskID}
	case rt == resultInputRequired:
		// Only when it could not be a round (the lease was lost meanwhile): not an outcome.
		return interceptor.Report{Outcome: residual.Unknown, Body: resp.Result, Error: "upstream asked for input (input_required) and the call could not wait for the host's next round"}
	case rt != resultComplete:
		return interceptor.Report{Outcome: residual.Unknown, Body: resp.Result, Error: fmt.Sprintf("upstream's result has resultType %q, which the proxy does not know", rt)}
	}
	var result struct {
		IsError bool `json:"isError"`
		Task    *struct {
			TaskID string `json:"taskId"`
		} `json:"task"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	}
	if err := json.Unmarshal(resp.Result, &result); err != nil {
		return interceptor.Report{Outcome: residual.Unknown, Body: resp.Result, Error: "upstream's result is not a tool result: " + err.Error()}
	}
	if result.Task != nil {
		if result.Task.TaskID == "" {
			return interceptor.Report{Outcome: residual.Unknown, Body: resp.Result, Error: "upstream queued the call as a task without a taskId"}
		}
		return interceptor.Report{Outcome: residual.Accepted, Body: resp.Result, Handle: result.Task.TaskID}
	}
	if !result.IsError {
		return interceptor.Report{Outcome: residual.Succeeded, Body: resp.Result}
	}
	var text []string
	for _, c := range result.Content {
		if c.Type == "text" {
			text = append(text, c.Text)
		}
	}
	joined := strings.Join(text, "\n")
	if len(text) > 0 && sdkRefusal(text[0]) {
		return interceptor.Report{Outcome: residual.Failed, Body: resp.Result, Error: "isError result in an MCP SDK's words for a call it refused before the tool ran: " + joined}
	}
	if rule.Matches(joined) {
		return interceptor.Report{Outcome: residual.Failed, Body: resp.Result, Error: "isError result matching a no_effect pattern: " + joined}
	}
	return interceptor.Report{Outcome: residual.Unknown, Body: resp.Result, Error: isErrorPrefix + joined}
}

// refusedBeforeRunning reports whether a JSON-RPC error code is one MCP 2026-07-28 gives a
// request refused before it is handled (SEP-2575, SEP-2243): a header that does not match
// the body, a client capability the request needs but did not declare, a revision the
// server does not serve. Such a call had no effect.
func refusedBeforeRunning(code int64) bool {
	switch code {
	case transport.CodeHeaderMismatch, transport.CodeMissingCapabilities, transport.CodeUnsupportedProtocol:
		return true
	}
	return false
}

// isErrorPrefix starts the Error of a Report classify left unknown for an isError result
// that proves nothing.
const isErrorPrefix = "isError result: "

// ambiguousIsError is the first text block of the host's answer, before the observation
// and upstream's own content, when upstream answered an isError result that does not
// prove no effect: the host learns that the server did answer, and why the key is blocked.
const ambiguousIsError = "the server answered an error; toolfence cannot tell whether it acted, so the call is recorded unknown and not sent again until it is settled"

// withBlock inserts a text block at index at of the content of result (a tool result the
// proxy made); result is unchanged when it is not one.
func withBlock(result json.RawMessage, at int, text string) json.RawMessage {
	var doc map[string]json.RawMessage
	var content []json.RawMessage
	if json.Unmarshal(result, &doc) != nil || json.Unmarshal(doc["content"], &content) != nil {
		return result
	}
	block, _ := json.Marshal(textBlock(text))
	at = min(at, len(content))
	content = append(content[:at], append([]json.RawMessage{block}, content[at:]...)...)
	doc["content"], _ = json.Marshal(content)
	out, err := json.Marshal(doc)
	if err != nil {
		return result
	}
	return out
}

// sdkRefusals are the starts of the first text block of an isError result in which an MCP
// SDK's server says it refused a call before the tool's handler ran, so the call had no
// effect:
//
//   - "MCP error -32602: " and "MCP error -32601: ": the TypeScript SDK (McpError's message
//     "MCP error <code>: …"), for invalid params (arguments failing the inputSchema) and an
//     unknown tool or method, which it answers as an isError result, not a JSON-RPC error
//     (but not its refusal of a tool's output, given after the tool ran: sdkOutputRefusals).
//   - `validating "arguments": `: the Go SDK (go-sdk v1.8.0 mcp/server.go), arguments
//     failing the tool's inputSchema.
//   - "Input validation error: ": the Python SDK's low-level server, arguments failing the
//     tool's inputSchema (jsonschema), checked before the handler.
//
// mcp-go and the Go SDK answer an unknown tool with JSON-RPC error -32602, which already
// proves no effect.
var sdkRefusals = [...]string{
	"MCP error -32602: ",
	"MCP error -32601: ",
	`validating "arguments": `,
	"Input validation error: ",
}

// sdkOutputRefusals are the starts of the TypeScript SDK's answers for a tool whose output
// breaks its outputSchema, given after the tool's handler ran (so it may have acted) though
// with the invalid-params code that otherwise says a call was refused before it ran:
//
//   - "MCP error -32602: Output validation error: ": an isError result (SDK 1.23 and later);
//   - "Tool NAME has an output schema but no structured content was provided" and "Invalid
//     structured content for tool NAME: ": JSON-RPC error -32602 messages (before 1.23).
var sdkOutputRefusals = regexp.MustCompile(`^(MCP error -32602: Output validation error: |Invalid structured content for tool |Tool .* has an output schema but no structured content was provided$)`)

// outputRefused reports whether text (a JSON-RPC error's message or an isError result's
// first text block) is the TypeScript SDK's refusal of a tool's output (sdkOutputRefusals).
func outputRefused(text string) bool { return sdkOutputRefusals.MatchString(text) }

// sdkRefusal reports whether first, the first text block of an isError result, starts as
// one of sdkRefusals, and is not an SDK's refusal of the output of a tool that ran
// (outputRefused).
func sdkRefusal(first string) bool {
	if outputRefused(first) {
		return false
	}
	for _, p := range sdkRefusals {
		if strings.HasPrefix(first, p) {
			return true
		}
	}
	return false
}
