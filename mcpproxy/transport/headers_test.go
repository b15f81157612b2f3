package transport

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"
)

func props(t *testing.T, schema string) map[string]json.RawMessage {
	t.Helper()
	var s struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	require.NoError(t, json.Unmarshal([]byte(schema), &s))
	return s.Properties
}

func TestParamBindings(t *testing.T) {
	b, err := ParamBindings(props(t, `{"properties":{
		"region":{"type":"string","x-mcp-header":"Region"},
		"n":{"type":"integer","x-mcp-header":"N"},
		"plain":{"type":"string"},
		"opts":{"type":"object","properties":{"dry":{"type":"boolean","x-mcp-header":"Dry-Run"}}}}}`))
	require.NoError(t, err)
	require.Equal(t, []ParamBinding{{Path: []string{"n"}, Header: "N"}, {Path: []string{"opts", "dry"}, Header: "Dry-Run"},
		{Path: []string{"region"}, Header: "Region"}}, b)

	for name, schema := range map[string]string{
		"number":    `{"properties":{"x":{"type":"number","x-mcp-header":"X"}}}`,
		"object":    `{"properties":{"x":{"type":"object","x-mcp-header":"X"}}}`,
		"bad name":  `{"properties":{"x":{"type":"string","x-mcp-header":"X Y"}}}`,
		"empty":     `{"properties":{"x":{"type":"string","x-mcp-header":""}}}`,
		"duplicate": `{"properties":{"x":{"type":"string","x-mcp-header":"A"},"y":{"type":"string","x-mcp-header":"a"}}}`,
	} {
		_, err := ParamBindings(props(t, schema))
		require.Error(t, err, name)
	}
}

func TestRequestHeadersRoundTrip(t *testing.T) {
	b, err := ParamBindings(props(t, `{"properties":{
		"region":{"type":"string","x-mcp-header":"Region"},
		"note":{"type":"string","x-mcp-header":"Note"},
		"n":{"type":"integer","x-mcp-header":"N"},
		"gone":{"type":"string","x-mcp-header":"Gone"}}}`))
	require.NoError(t, err)
	id, _ := jsonrpc.MakeID(float64(1))
	req := &jsonrpc.Request{ID: id, Method: "tools/call", Params: json.RawMessage(`{"name":"deploy","arguments":{"region":"eu-1","note":" héllo ","n":42,"gone":null}}`)}
	h := RequestHeaders(Rev20260728, req, b)
	require.Equal(t, "2026-07-28", h.Get("mcp-protocol-version"))
	require.Equal(t, "tools/call", h.Get("MCP-METHOD"))
	require.Equal(t, "deploy", h.Get("Mcp-Name"))
	require.Equal(t, "eu-1", h.Get("Mcp-Param-Region"))
	require.Equal(t, "=?base64?IGjDqWxsbyA=?=", h.Get("Mcp-Param-Note"), "blanks at the ends and non-ASCII travel in Base64")
	require.Equal(t, "42", h.Get("Mcp-Param-N"))
	require.Empty(t, h.Values("Mcp-Param-Gone"), "a null argument sends no header")
	require.NoError(t, CheckRequestHeaders(h, req, b))

	bad := func(mutate func(http.Header)) error {
		c := h.Clone()
		mutate(c)
		return CheckRequestHeaders(c, req, b)
	}
	require.ErrorContains(t, bad(func(h http.Header) { h.Del("Mcp-Method") }), "missing required Mcp-Method")
	require.ErrorContains(t, bad(func(h http.Header) { h.Set("Mcp-Method", "TOOLS/CALL") }), "does not match")
	require.ErrorContains(t, bad(func(h http.Header) { h.Del("Mcp-Name") }), "missing required Mcp-Name")
	require.ErrorContains(t, bad(func(h http.Header) { h.Set("Mcp-Name", "other") }), "does not match")
	require.NoError(t, bad(func(h http.Header) { h.Set("Mcp-Name", "  deploy ") }), "blanks around a value are not part of it")
	require.ErrorContains(t, bad(func(h http.Header) { h.Del("Mcp-Param-Region") }), "missing Mcp-Param-Region")
	require.ErrorContains(t, bad(func(h http.Header) { h.Set("Mcp-Param-Region", "us-1") }), "does not match")
	require.ErrorContains(t, bad(func(h http.Header) { h.Set("Mcp-Param-Note", "=?base64?IGjDqWxsbyA?=") }), "not valid Base64")
	require.NoError(t, bad(func(h http.Header) { h.Set("Mcp-Param-N", "42.0") }), "integers compare as numbers")
	require.ErrorContains(t, bad(func(h http.Header) { h.Set("Mcp-Param-Gone", "x") }), "is absent")
	require.NoError(t, bad(func(h http.Header) { h.Set("Mcp-Param-Region", "=?base64?ZXUtMQ==?=") }), "Base64 of the value is the value")

	list := &jsonrpc.Request{ID: id, Method: "tools/list", Params: json.RawMessage(`{}`)}
	lh := RequestHeaders(Rev20260728, list, nil)
	require.Empty(t, lh.Values("Mcp-Name"), "tools/list names nothing")
	require.NoError(t, CheckRequestHeaders(lh, list, nil))
}

func TestReadMetaAndWithMeta(t *testing.T) {
	m := ReadMeta(json.RawMessage(`{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}}`))
	require.Equal(t, "2026-07-28", m.Version)
	require.JSONEq(t, `{"elicitation":{}}`, string(m.Capabilities))
	require.True(t, m.HasMeta)
	require.Equal(t, RequestMeta{}, ReadMeta(json.RawMessage(`{"name":"x"}`)))
	require.Equal(t, RequestMeta{}, ReadMeta(json.RawMessage(`[1]`)))

	out := WithMeta(json.RawMessage(`{"name":"x","_meta":{"keep":1,"drop":2}}`), map[string]any{"add": "v", "drop": nil})
	require.JSONEq(t, `{"name":"x","_meta":{"keep":1,"add":"v"}}`, string(out))
	require.JSONEq(t, `{"_meta":{"a":true}}`, string(WithMeta(nil, map[string]any{"a": true})))
	require.Equal(t, `[1]`, string(WithMeta(json.RawMessage(`[1]`), map[string]any{"a": true})), "not an object: unchanged")
}

func TestResultTypeAndErrorStatus(t *testing.T) {
	for in, want := range map[string]string{
		`{"content":[]}`:                          "complete",
		`{"resultType":"complete"}`:               "complete",
		`{"resultType":"input_required"}`:         "input_required",
		`{"resultType":"task","taskId":"t1"}`:     "task",
		`{"content":[{"text":"resultType"}]}`:     "complete",
		`{"resultType":null,"content":[]}`:        "complete",
		`{"resultType":"something-else"}`:         "something-else",
		`{"resultType":7}`:                        "",
		`{"resultType":"x", "broken": }`:          "",
		`{"content":[],"_meta":{"resultType":1}}`: "complete",
	} {
		got, ok := ResultType(json.RawMessage(in))
		require.Equal(t, want, got, in)
		require.Equal(t, want != "", ok, in)
	}
	status := func(code int64) int {
		id, _ := jsonrpc.MakeID(float64(1))
		return ErrorStatus(&jsonrpc.Response{ID: id, Error: &jsonrpc.Error{Code: code}})
	}
	require.Equal(t, 404, status(-32601))
	require.Equal(t, 400, status(-32602))
	require.Equal(t, 400, status(CodeUnsupportedProtocol))
	require.Equal(t, 400, status(CodeMissingCapabilities))
	require.Equal(t, 400, status(CodeHeaderMismatch))
	require.Equal(t, 0, status(-32603))
	require.Equal(t, 0, ErrorStatus(&jsonrpc.Response{Result: json.RawMessage(`{}`)}))
}
