package tools

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// describeInput renders a JSON schema (decoded with UseNumber) as one line a model reads in
// a tool's description: every field with its type, whether it is required, its constraints
// and its description, nested objects and arrays included. Keywords it has no words for are
// shown as keyword=JSON, so no constraint of the schema is left out.
func describeInput(schema any) string {
	return "Input: a JSON " + describeNode(schema, true, false)
}

// annotations are keywords that say nothing about what is valid, or that describeNode words
// itself.
var annotations = map[string]bool{
	"type": true, "properties": true, "required": true, "additionalProperties": true,
	"items": true, "description": true, "title": true, "$schema": true, "$id": true,
	"$comment": true, "anyOf": true, "oneOf": true, "patternProperties": true,
}

// constraintWords words the common constraint keywords, in the order they are shown.
var constraintWords = []struct {
	keyword string
	word    func(v any) string
}{
	{"enum", func(v any) string { return "one of " + listJSON(asList(v)) }},
	{"const", func(v any) string { return "exactly " + listJSON([]any{v}) }},
	{"format", func(v any) string { return fmt.Sprintf("format %v", v) }},
	{"pattern", func(v any) string { return fmt.Sprintf("matching %v", v) }},
	{"minLength", func(v any) string { return fmt.Sprintf("at least %v characters", v) }},
	{"maxLength", func(v any) string { return fmt.Sprintf("at most %v characters", v) }},
	{"minimum", func(v any) string { return fmt.Sprintf("minimum %v", v) }},
	{"maximum", func(v any) string { return fmt.Sprintf("maximum %v", v) }},
	{"exclusiveMinimum", func(v any) string { return fmt.Sprintf("greater than %v", v) }},
	{"exclusiveMaximum", func(v any) string { return fmt.Sprintf("less than %v", v) }},
	{"multipleOf", func(v any) string { return fmt.Sprintf("multiple of %v", v) }},
	{"minItems", func(v any) string { return fmt.Sprintf("at least %v items", v) }},
	{"maxItems", func(v any) string { return fmt.Sprintf("at most %v items", v) }},
	{"uniqueItems", func(v any) string {
		if v == true {
			return "no repeated items"
		}
		return ""
	}},
	{"minProperties", func(v any) string { return fmt.Sprintf("at least %v fields", v) }},
	{"maxProperties", func(v any) string { return fmt.Sprintf("at most %v fields", v) }},
	{"default", func(v any) string { return "default " + listJSON([]any{v}) }},
	{"examples", func(v any) string { return "e.g. " + listJSON(asList(v)) }},
}

// describeNode renders one schema: its type and shape, "required" when the enclosing object
// requires it, its constraints, then its description in parentheses. top is the tool's whole
// input, whose description is the tool's own.
func describeNode(schema any, top, required bool) string {
	m, ok := schema.(map[string]any)
	if !ok { // the boolean schemas
		if schema == false {
			return "nothing (no value is allowed)"
		}
		return "any JSON value"
	}
	var parts []string
	typ := typeWords(m["type"])
	if alts := alternatives(m); len(alts) > 0 {
		shapes := make([]string, len(alts))
		for i, alt := range alts {
			shapes[i] = describeNode(alt, false, false)
		}
		parts = append(parts, "one of: "+strings.Join(shapes, " | "))
	}
	switch {
	case m["properties"] != nil || m["patternProperties"] != nil:
		parts = append(parts, typ+" "+describeFields(m))
	case typ == "object" && m["additionalProperties"] != nil:
		parts = append(parts, "object with values of "+describeNode(m["additionalProperties"], false, false))
	case typ == "array" && m["items"] != nil:
		parts = append(parts, "array of "+describeNode(m["items"], false, false))
	case typ != "":
		parts = append(parts, typ)
	}
	if len(parts) == 0 {
		parts = append(parts, "any JSON value")
	}
	if required {
		parts = append(parts, "required")
	}
	out := strings.Join(append(parts, constraints(m)...), ", ")
	if d, ok := m["description"].(string); ok && d != "" && !top {
		out += " (" + d + ")"
	}
	return out
}

// describeFields renders an object's fields by name: {"name" type, required, constraints; …},
// then whether other fields are allowed.
func describeFields(m map[string]any) string {
	required := map[string]bool{}
	for _, r := range asList(m["required"]) {
		if s, ok := r.(string); ok {
			required[s] = true
		}
	}
	var fields []string
	props, _ := m["properties"].(map[string]any)
	for _, name := range slices.Sorted(maps.Keys(props)) {
		field, _ := json.Marshal(name)
		fields = append(fields, string(field)+" "+describeNode(props[name], false, required[name]))
	}
	if pp, ok := m["patternProperties"].(map[string]any); ok {
		for _, pat := range slices.Sorted(maps.Keys(pp)) {
			fields = append(fields, fmt.Sprintf("fields named like %s: %s", pat, describeNode(pp[pat], false, false)))
		}
	}
	switch ap := m["additionalProperties"]; {
	case ap == false:
		fields = append(fields, "no other fields")
	case ap != nil && ap != true:
		fields = append(fields, "other fields: "+describeNode(ap, false, false))
	}
	return "{" + strings.Join(fields, "; ") + "}"
}

// constraints words every keyword of m that constrains the value, known ones first.
func constraints(m map[string]any) []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range constraintWords {
		seen[c.keyword] = true
		if v, ok := m[c.keyword]; ok {
			if w := c.word(v); w != "" {
				out = append(out, w)
			}
		}
	}
	for _, kw := range slices.Sorted(maps.Keys(m)) {
		if seen[kw] || annotations[kw] {
			continue
		}
		raw, _ := json.Marshal(m[kw])
		out = append(out, kw+"="+string(raw))
	}
	return out
}

// typeWords renders the type keyword: "string", or "string or null".
func typeWords(t any) string {
	switch t := t.(type) {
	case string:
		return t
	case []any:
		names := make([]string, 0, len(t))
		for _, n := range t {
			names = append(names, fmt.Sprint(n))
		}
		return strings.Join(names, " or ")
	}
	return ""
}

func alternatives(m map[string]any) []any {
	if alts := asList(m["oneOf"]); len(alts) > 0 {
		return alts
	}
	return asList(m["anyOf"])
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}
