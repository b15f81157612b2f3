package transport

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// The HTTP headers of MCP requests (SEP-2243). From 2026-07-28 on a request carries
// Mcp-Method, and Mcp-Name for the three methods that name something; a tools/call also
// mirrors the arguments its tool's inputSchema annotates with x-mcp-header.
const (
	HeaderProtocolVersion = "Mcp-Protocol-Version"
	HeaderSessionID       = "Mcp-Session-Id"
	HeaderMethod          = "Mcp-Method"
	HeaderName            = "Mcp-Name"
	HeaderParamPrefix     = "Mcp-Param-"
)

// ParamBinding is one x-mcp-header annotation of a tool's inputSchema: the argument at Path
// (property names from the top of the arguments) travels also in header
// Mcp-Param-<Header>.
type ParamBinding struct {
	Path   []string
	Header string
}

// schemaProp is what an inputSchema property says about x-mcp-header.
type schemaProp struct {
	Type       json.RawMessage            `json:"type"`
	XMCPHeader json.RawMessage            `json:"x-mcp-header"`
	Properties map[string]json.RawMessage `json:"properties"`
}

// ParamBindings returns the x-mcp-header bindings of a tool whose inputSchema has these
// properties, in a stable order. An invalid annotation (on a property that is not a string,
// integer or boolean; a header name that is not an HTTP token; a name used twice, ignoring
// case) is an error naming the property: a server must not list such a tool, and a proxy
// must not guess its headers.
func ParamBindings(properties map[string]json.RawMessage) ([]ParamBinding, error) {
	var out []ParamBinding
	seen := map[string]bool{}
	var walk func(props map[string]json.RawMessage, prefix []string) error
	walk = func(props map[string]json.RawMessage, prefix []string) error {
		names := make([]string, 0, len(props))
		for n := range props {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			var p schemaProp
			if json.Unmarshal(props[n], &p) != nil {
				continue // not a schema object: nothing annotated
			}
			path := append(append([]string(nil), prefix...), n)
			if p.XMCPHeader != nil {
				var typ, header string
				_ = json.Unmarshal(p.Type, &typ)
				if typ != "string" && typ != "integer" && typ != "boolean" {
					return fmt.Errorf("property %q: x-mcp-header on a %s property (only string, integer and boolean may be mirrored)", strings.Join(path, "."), cmpStr(typ, "non-primitive"))
				}
				if json.Unmarshal(p.XMCPHeader, &header) != nil || !validToken(header) {
					return fmt.Errorf("property %q: x-mcp-header must be an HTTP token (letters, digits and !#$%%&'*+-.^_`|~)", strings.Join(path, "."))
				}
				if seen[strings.ToLower(header)] {
					return fmt.Errorf("property %q: x-mcp-header %q is used twice", strings.Join(path, "."), header)
				}
				seen[strings.ToLower(header)] = true
				out = append(out, ParamBinding{Path: path, Header: header})
			}
			if len(p.Properties) > 0 {
				if err := walk(p.Properties, path); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(properties, nil); err != nil {
		return nil, err
	}
	return out, nil
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// validToken reports whether s is an HTTP token (RFC 9110 tchar, at least one).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		switch {
		case c >= '0' && c <= '9', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case strings.ContainsRune("!#$%&'*+-.^_`|~", c):
		default:
			return false
		}
	}
	return true
}

// RequestName is the name a request's Mcp-Name header mirrors: params.name of tools/call and
// prompts/get, params.uri of resources/read, params.taskId of the tasks extension's
// tasks/get, tasks/update and tasks/cancel; ok is false for other methods.
func RequestName(method string, params json.RawMessage) (name string, ok bool) {
	var p struct {
		Name   *string `json:"name"`
		URI    *string `json:"uri"`
		TaskID *string `json:"taskId"`
	}
	switch method {
	case "tasks/get", "tasks/update", "tasks/cancel":
		if json.Unmarshal(params, &p) == nil && p.TaskID != nil {
			return *p.TaskID, true
		}
		return "", false
	case "tools/call", "prompts/get":
		if json.Unmarshal(params, &p) == nil && p.Name != nil {
			return *p.Name, true
		}
		return "", true
	case "resources/read":
		if json.Unmarshal(params, &p) == nil && p.URI != nil {
			return *p.URI, true
		}
		return "", true
	}
	return "", false
}

// RequestHeaders returns the standard headers of a request to a stateless (2026-07-28)
// server: Mcp-Protocol-Version rev, Mcp-Method, Mcp-Name where the method names something,
// and Mcp-Param-<Header> for each binding whose argument is a string, boolean or safe
// integer (others are left out: a server then refuses the call, as it should).
func RequestHeaders(rev string, req *jsonrpc.Request, bindings []ParamBinding) http.Header {
	h := http.Header{}
	h.Set(HeaderProtocolVersion, rev)
	h.Set(HeaderMethod, req.Method)
	if name, ok := RequestName(req.Method, req.Params); ok {
		h.Set(HeaderName, name) // as the SDKs send it: the name itself, never Base64
	}
	if req.Method != "tools/call" || len(bindings) == 0 {
		return h
	}
	args := arguments(req.Params)
	for _, b := range bindings {
		raw, ok := lookup(args, b.Path)
		if !ok || string(raw) == "null" {
			continue
		}
		if v, ok := primitive(raw); ok {
			h.Set(HeaderParamPrefix+b.Header, encodeValue(v))
		}
	}
	return h
}

// CheckRequestHeaders checks the standard headers of a host's stateless request against
// its body (SEP-2243): Mcp-Method must be there and equal the method; for tools/call,
// prompts/get and resources/read Mcp-Name must be there and equal the name (surrounding
// blanks ignored, as for any header value; never Base64); a tools/call's Mcp-Param-<Header> must be there
// for each bound argument that is present and not null, absent otherwise, and equal to it.
// The error says which header and why: answer it with CodeHeaderMismatch (HTTP 400) and
// relay nothing. Header names are case-insensitive, values are not.
func CheckRequestHeaders(h http.Header, req *jsonrpc.Request, bindings []ParamBinding) error {
	method := strings.TrimSpace(h.Get(HeaderMethod))
	switch {
	case method == "":
		return errors.New("missing required Mcp-Method header")
	case method != req.Method:
		return fmt.Errorf("header mismatch: Mcp-Method %q does not match the body's method %q", method, req.Method)
	}
	if name, ok := RequestName(req.Method, req.Params); ok {
		got, present := h[http.CanonicalHeaderKey(HeaderName)]
		if !present && strings.HasPrefix(req.Method, "tasks/") {
			present, got = true, []string{name} // optional on the tasks extension's requests; checked when sent
		}
		if !present || strings.TrimSpace(got[0]) == "" {
			return fmt.Errorf("missing required Mcp-Name header for %s", req.Method)
		}
		if strings.TrimSpace(got[0]) != name {
			return fmt.Errorf("header mismatch: Mcp-Name %q does not match the body's %q", strings.TrimSpace(got[0]), name)
		}
	}
	if req.Method != "tools/call" || len(bindings) == 0 {
		return nil
	}
	args := arguments(req.Params)
	for _, b := range bindings {
		header := HeaderParamPrefix + b.Header
		got := strings.TrimSpace(h.Get(header))
		raw, present := lookup(args, b.Path)
		if !present || string(raw) == "null" {
			if got != "" {
				return fmt.Errorf("header mismatch: %s is sent but argument %q is absent", header, strings.Join(b.Path, "."))
			}
			continue
		}
		if got == "" {
			return fmt.Errorf("header mismatch: missing %s for argument %q", header, strings.Join(b.Path, "."))
		}
		decoded, ok := decodeValue(got)
		if !ok {
			return fmt.Errorf("header mismatch: %s is not valid Base64", header)
		}
		v, ok := primitive(raw)
		if !ok || !sameValue(decoded, raw, v) {
			return fmt.Errorf("header mismatch: %s does not match argument %q", header, strings.Join(b.Path, "."))
		}
	}
	return nil
}

// arguments returns params.arguments as an object (nil when it is not one).
func arguments(params json.RawMessage) map[string]json.RawMessage {
	var p struct {
		Arguments map[string]json.RawMessage `json:"arguments"`
	}
	_ = json.Unmarshal(params, &p)
	return p.Arguments
}

// lookup returns the value at path in args.
func lookup(args map[string]json.RawMessage, path []string) (json.RawMessage, bool) {
	cur := args
	for i, name := range path {
		raw, ok := cur[name]
		if !ok {
			return nil, false
		}
		if i == len(path)-1 {
			return raw, true
		}
		cur = nil
		if json.Unmarshal(raw, &cur) != nil {
			return nil, false
		}
	}
	return nil, false
}

// primitive is the header text of a JSON string, boolean or integer within ±(2^53−1).
func primitive(raw json.RawMessage) (string, bool) {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return "", false
	}
	switch t := v.(type) {
	case string:
		return t, true
	case bool:
		return strconv.FormatBool(t), true
	case float64:
		if math.IsNaN(t) || math.IsInf(t, 0) || t != math.Trunc(t) || t > maxSafeInteger || t < minSafeInteger {
			return "", false
		}
		return strconv.FormatInt(int64(t), 10), true
	}
	return "", false
}

// sameValue compares a decoded header value with the argument (raw, whose header text is
// text): integers compare as numbers ("42" and "42.0" match), everything else as text.
func sameValue(header string, raw json.RawMessage, text string) bool {
	var n float64
	if json.Unmarshal(raw, &n) == nil {
		h, err := strconv.ParseFloat(header, 64)
		return err == nil && h == n
	}
	return header == text
}

const (
	base64Prefix, base64Suffix = "=?base64?", "?="
	maxSafeInteger             = 1<<53 - 1
	minSafeInteger             = -(1<<53 - 1)
)

// encodeValue is a header value for s: s itself when it is printable ASCII without blanks
// at either end, else "=?base64?<standard Base64>?=" (also for text that looks encoded).
func encodeValue(s string) string {
	plain := s == "" || (s[0] != ' ' && s[0] != '\t' && s[len(s)-1] != ' ' && s[len(s)-1] != '\t')
	for i := 0; plain && i < len(s); i++ {
		plain = s[i] >= 0x20 && s[i] <= 0x7e
	}
	if plain && !(strings.HasPrefix(s, base64Prefix) && strings.HasSuffix(s, base64Suffix)) {
		return s
	}
	return base64Prefix + base64.StdEncoding.EncodeToString([]byte(s)) + base64Suffix
}

// decodeValue undoes encodeValue; a value with the Base64 wrapper that is not valid
// standard Base64 is refused (ok false).
func decodeValue(v string) (string, bool) {
	inner, ok := strings.CutPrefix(v, base64Prefix)
	if !ok {
		return v, true
	}
	inner, ok = strings.CutSuffix(inner, base64Suffix)
	if !ok {
		return v, true
	}
	b, err := base64.StdEncoding.DecodeString(inner)
	if err != nil {
		return "", false
	}
	return string(b), true
}

// bindingsKey carries the x-mcp-header bindings of a tools/call's tool to Write.
type bindingsKey struct{}

// WithParamBindings returns ctx carrying the x-mcp-header bindings of the tool a
// tools/call written with it calls: an HTTP upstream speaking 2026-07-28 gets the mirrored
// Mcp-Param-* headers from them.
func WithParamBindings(ctx context.Context, b []ParamBinding) context.Context {
	if len(b) == 0 {
		return ctx
	}
	return context.WithValue(ctx, bindingsKey{}, b)
}

func paramBindings(ctx context.Context) []ParamBinding {
	b, _ := ctx.Value(bindingsKey{}).([]ParamBinding)
	return b
}
