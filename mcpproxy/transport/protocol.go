package transport

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// The MCP revisions the proxy speaks, on either side. Revisions are dated YYYY-MM-DD, so
// they compare as strings.
const (
	// Rev20251125 is the last revision with sessions: initialize, Mcp-Session-Id, server
	// requests (sampling, elicitation, roots/list) and the GET stream.
	Rev20251125 = "2025-11-25"
	// Rev20260728 is stateless: no initialize and no session; each request carries its
	// revision and the client's capabilities in params._meta (SEP-2575); a server that
	// needs input answers resultType "input_required" (SEP-2322).
	Rev20260728 = "2026-07-28"
)

// Stateless reports whether rev is a stateless revision (2026-07-28 or later).
func Stateless(rev string) bool { return rev >= Rev20260728 }

// The params._meta keys of the 2026-07-28 revision (SEP-2575).
const (
	MetaProtocolVersion    = "io.modelcontextprotocol/protocolVersion"
	MetaClientCapabilities = "io.modelcontextprotocol/clientCapabilities"
	MetaClientInfo         = "io.modelcontextprotocol/clientInfo"
	MetaServerInfo         = "io.modelcontextprotocol/serverInfo"
	MetaLogLevel           = "io.modelcontextprotocol/logLevel"
	MetaSubscriptionID     = "io.modelcontextprotocol/subscriptionId"
)

// The JSON-RPC error codes MCP reserves (−32020…−32099) that the proxy reads or answers.
const (
	CodeHeaderMismatch      = -32020 // an Mcp-* header disagrees with the body
	CodeMissingCapabilities = -32021 // the request needs a client capability it did not declare
	CodeUnsupportedProtocol = -32022 // the requested revision is not served
)

// RequestMeta is what a 2026-07-28 request says about its client in params._meta.
type RequestMeta struct {
	// Version is io.modelcontextprotocol/protocolVersion ("" when absent or not a string).
	Version string
	// Capabilities is io.modelcontextprotocol/clientCapabilities as sent (nil when absent).
	Capabilities json.RawMessage
	// ClientInfo is io.modelcontextprotocol/clientInfo as sent (nil when absent).
	ClientInfo json.RawMessage
	// HasMeta says params held a _meta object at all.
	HasMeta bool
}

// ReadMeta returns the revision fields of params._meta; params that are not a JSON object,
// or a _meta that is not one, give the zero RequestMeta.
func ReadMeta(params json.RawMessage) RequestMeta {
	if len(params) == 0 || !bytes.Contains(params, []byte(`"_meta"`)) {
		return RequestMeta{}
	}
	var p struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	if json.Unmarshal(params, &p) != nil || p.Meta == nil {
		return RequestMeta{}
	}
	m := RequestMeta{HasMeta: true, Capabilities: p.Meta[MetaClientCapabilities], ClientInfo: p.Meta[MetaClientInfo]}
	_ = json.Unmarshal(p.Meta[MetaProtocolVersion], &m.Version)
	return m
}

// WithMeta returns params (a JSON object, or empty) with the given keys set in its _meta,
// keeping what else _meta holds. A value of nil removes the key. It returns params
// unchanged when they are not a JSON object.
func WithMeta(params json.RawMessage, set map[string]any) json.RawMessage {
	var doc map[string]json.RawMessage
	if len(bytes.TrimSpace(params)) == 0 {
		doc = map[string]json.RawMessage{}
	} else if json.Unmarshal(params, &doc) != nil || doc == nil {
		return params
	}
	meta := map[string]json.RawMessage{}
	if raw, ok := doc["_meta"]; ok && json.Unmarshal(raw, &meta) != nil {
		meta = map[string]json.RawMessage{}
	}
	if meta == nil {
		meta = map[string]json.RawMessage{}
	}
	for k, v := range set {
		if v == nil {
			delete(meta, k)
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			return params
		}
		meta[k] = b
	}
	doc["_meta"], _ = json.Marshal(meta)
	out, err := json.Marshal(doc)
	if err != nil {
		return params
	}
	return out
}

// ErrorStatus is the HTTP status a stateless (2026-07-28) server answers a JSON-RPC error
// with (SEP-2575): 404 for method not found; 400 for invalid params, an unsupported
// revision, missing client capabilities and a header mismatch; 0 (an ordinary 200 answer)
// for any other answer.
func ErrorStatus(resp *jsonrpc.Response) int {
	if resp == nil || resp.Error == nil {
		return 0
	}
	we, ok := resp.Error.(*jsonrpc.Error)
	if !ok {
		return 0
	}
	switch we.Code {
	case jsonrpc.CodeMethodNotFound:
		return http.StatusNotFound
	case jsonrpc.CodeInvalidParams, CodeUnsupportedProtocol, CodeMissingCapabilities, CodeHeaderMismatch:
		return http.StatusBadRequest
	}
	return 0
}

// ResultType is the resultType of a result (SEP-2322) and whether it could be read:
// "complete" when absent (a result of a revision before 2026-07-28 has none),
// "input_required", "task" (the tasks extension), or whatever else upstream wrote; ok is
// false when a resultType is there but is not a string or result is not a JSON object.
func ResultType(result json.RawMessage) (rt string, ok bool) {
	var r struct {
		ResultType *string `json:"resultType"`
	}
	if !bytes.Contains(result, []byte(`"resultType"`)) {
		return "complete", true // not read: the caller reads the result itself
	}
	if json.Unmarshal(result, &r) != nil {
		return "", false
	}
	if r.ResultType == nil {
		return "complete", true
	}
	return *r.ResultType, true
}

// CancelledID returns the request id a notifications/cancelled names in its params; ok is
// false when they name none (malformed, missing, or not a string or number).
func CancelledID(params json.RawMessage) (id jsonrpc.ID, ok bool) {
	var p struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil || p.RequestID == nil {
		return jsonrpc.ID{}, false
	}
	id, err := jsonrpc.MakeID(p.RequestID)
	return id, err == nil
}
