package mcpserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/invopop/jsonschema"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/toolfence/toolfence/mcpwire"
)

// Tool names.
const (
	ToolListPending = "list_pending"
	ToolInspect     = "inspect_residual"
	ToolBegin       = "begin_call"
	ToolCommit      = "commit_call"
	ToolRenew       = "renew_lease"
	ToolResolve     = "resolve_residual"
	ToolReconcile   = "reconcile"
)

// schemaOf reflects the JSON schema of T with invopop/jsonschema: one self-contained object
// schema (no $ref), unknown properties refused for inputs, and every property and items
// schema a JSON object (see objectSchemas).
func schemaOf[T any]() json.RawMessage {
	r := jsonschema.Reflector{ExpandedStruct: true, DoNotReference: true, Anonymous: true}
	s := r.Reflect(new(T))
	objectSchemas(s)
	b, err := json.Marshal(s)
	if err != nil {
		// Only our own static types are reflected; a failure is a programming error
		// caught by the schema test.
		panic(fmt.Sprintf("mcpserver: schema of %T: %v", *new(T), err))
	}
	return b
}

// anyJSON is the schema of a field that holds any JSON value (a json.RawMessage).
const anyJSON = "Any JSON value: object, array, string, number, boolean or null."

// objectSchemas gives every empty property or items schema under s (what invopop reflects
// for a json.RawMessage without a description, and marshals as the boolean schema true) a
// description, so it marshals as an object schema accepting the same values. MCP clients
// on the TypeScript SDK refuse a tool list whose property schemas are not objects.
func objectSchemas(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if s.Properties != nil {
		for p := s.Properties.Oldest(); p != nil; p = p.Next() {
			if reflect.DeepEqual(p.Value, &jsonschema.Schema{}) {
				s.Properties.Set(p.Key, &jsonschema.Schema{Description: anyJSON})
				continue
			}
			objectSchemas(p.Value)
		}
	}
	if reflect.DeepEqual(s.Items, &jsonschema.Schema{}) {
		s.Items = &jsonschema.Schema{Description: anyJSON}
	}
	objectSchemas(s.Items)
}

func boolp(b bool) *bool { return &b }

type toolDef struct {
	tool    mcp.Tool
	handler server.ToolHandlerFunc
}

func (sp *space) addTools() {
	ro := mcp.ToolAnnotation{ReadOnlyHint: boolp(true), DestructiveHint: boolp(false), IdempotentHint: boolp(true), OpenWorldHint: boolp(false)}
	write := func(destructive, idempotent, openWorld bool) mcp.ToolAnnotation {
		return mcp.ToolAnnotation{ReadOnlyHint: boolp(false), DestructiveHint: boolp(destructive), IdempotentHint: boolp(idempotent), OpenWorldHint: boolp(openWorld)}
	}
	defs := []toolDef{
		{newTool[ListPendingInput, ListResult](ToolListPending, "List pending residuals",
			"List the residuals a predecessor left open in this namespace: pending (in flight under a live lease), "+
				"unknown (may have reached upstream, nobody recorded the outcome) and accepted (queued upstream). "+
				"Each row says what recovery is due.", ro), sp.listPending},
		{newTool[InspectInput, ResidualView](ToolInspect, "Inspect a residual",
			"Show one residual whole: every attempt with its holder, token and digests, the cached result, "+
				"evidence from fenced-out holders and the audit of resolutions.", ro), sp.inspect},
		{newTool[BeginInput, BeginResult](ToolBegin, "Begin a guarded call",
			"Call this BEFORE a side-effecting tool call. decision=proceed: you hold the lease; perform the call once, "+
				"then commit_call with key, token and lease_secret (a secret only you receive: keep it, it makes you the holder). "+
				"decision=replay: the call already succeeded; use result and do NOT call again. "+
				"decision=blocked: do NOT perform the call; follow violation.recovery.", write(false, false, false)), sp.begin},
		{newTool[CommitInput, CommitResult](ToolCommit, "Commit a call's outcome",
			"Record what upstream answered for the call begin_call let you perform, under its fencing token and the lease_secret "+
				"begin_call returned. The claimed outcome must agree with upstream_status: a 202 or queued answer is outcome=accepted "+
				"with the handle, never succeeded; a timeout, 408, 409, 429 or 5xx is outcome=unknown, never failed; "+
				"unknown is always allowed when you cannot tell. "+
				"Refused (isError) when the lease was lost: the outcome is then kept as evidence only.", write(false, false, false)), sp.commit},
		{newTool[RenewInput, RenewResult](ToolRenew, "Renew a lease",
			"Extend the lease of a call still in flight, under its fencing token and the lease_secret begin_call returned; "+
				"refused when the lease was lost.",
			write(false, true, false)), sp.renew},
		{newTool[ResolveInput, ResolveResult](ToolResolve, "Resolve a residual",
			"Settle an unknown or accepted residual as succeeded or failed after checking upstream. Takes a new fencing "+
				"token, so the old holder's late commit is refused. Refused for a pending residual under a live lease.",
			write(true, false, false)), sp.resolve},
		{newTool[ReconcileInput, ReconcileResult](ToolReconcile, "Reconcile through probes",
			"Ask upstream, through the probes registered for each operation, what became of unknown and accepted residuals "+
				"(one key, or every open residual of a task / operation / the namespace); settles what the probes know and "+
				"lists the rest with the reason.", write(false, true, true)), sp.reconcile},
	}
	tools := make([]server.ServerTool, len(defs))
	for i, d := range defs {
		tools[i] = server.ServerTool{Tool: d.tool, Handler: d.handler}
	}
	sp.mcp.AddTools(tools...)
}

func newTool[In, Out any](name, title, description string, ann mcp.ToolAnnotation) mcp.Tool {
	ann.Title = title
	return mcp.Tool{
		Name: name, Title: title, Description: description,
		RawInputSchema: schemaOf[In](), RawOutputSchema: schemaOf[Out](),
		Annotations: ann,
	}
}

// decode parses the tool arguments strictly into T: unknown fields and wrong types are
// refused with a message naming the field.
func decode[T any](req mcp.CallToolRequest) (T, error) {
	var v T
	raw := []byte(req.Params.RawArguments)
	if len(raw) == 0 && req.Params.Arguments != nil {
		var err error
		if raw, err = json.Marshal(req.Params.Arguments); err != nil {
			return v, fmt.Errorf("arguments cannot be encoded: %w", err)
		}
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		raw = []byte("{}")
	}
	if raw[0] != '{' {
		return v, errors.New("arguments must be a JSON object")
	}
	if err := checkText(raw); err != nil {
		return v, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return v, explainDecode[T](err)
	}
	return v, nil
}

func explainDecode[T any](err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			return fmt.Errorf("arguments must be a JSON object, got %s", te.Value)
		}
		return fmt.Errorf("field %q must be %s, got %s", field, typeWords(te.Type), te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("arguments are not valid JSON: %v (at offset %d)", se, se.Offset)
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return fmt.Errorf("unknown field %s (accepted: %s)", name, strings.Join(fieldNames[T](), ", "))
	}
	return fmt.Errorf("arguments: %v", err)
}

func typeWords(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Bool:
		return "a boolean"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "a " + t.String()
}

func fieldNames[T any]() []string {
	t := reflect.TypeFor[T]()
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// toolError is an isError result: text "TOOL: KIND: MESSAGE; recovery: RECOVERY" and the
// structured content {"error": mcpwire.ErrorInfo}.
func toolError(tool string, kind mcpwire.Kind, msg, recovery string) *mcp.CallToolResult {
	return errorResult(tool, mcpwire.ErrorInfo{Kind: kind, Message: msg, Recovery: recovery})
}

func errorResult(tool string, info mcpwire.ErrorInfo) *mcp.CallToolResult {
	text := fmt.Sprintf("%s: %s: %s", tool, info.Kind, info.Message)
	if info.Recovery != "" {
		text += "; recovery: " + info.Recovery
	}
	res := mcp.NewToolResultError(text)
	res.StructuredContent = map[string]any{"error": info}
	return res
}

func invalid(tool string, err error) *mcp.CallToolResult {
	return toolError(tool, mcpwire.KindInvalidInput, err.Error(), "fix the arguments and call again; nothing was written")
}

// okResult is a structured result with a text fallback: a one-line summary and the JSON.
func okResult(structured any, summary string) *mcp.CallToolResult {
	b, err := json.Marshal(structured)
	if err != nil {
		return toolError("toolfence", mcpwire.KindInternal, "result cannot be encoded: "+err.Error(), "")
	}
	return mcp.NewToolResultStructured(structured, summary+"\n"+string(b))
}
