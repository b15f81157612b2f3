package tools

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/toolfence/toolfence/residual"
)

// node is the subset of JSON Schema that invopop/jsonschema emits for plain Go structs, as
// much as validate checks: type, enum, const, properties, required, additionalProperties,
// patternProperties, items, oneOf and anyOf (both as "any of"), and the date-time format.
// Other keywords (lengths, bounds, other formats) are not checked here; decoding into the Go
// type catches what Go cannot represent.
type node struct {
	// never is the schema `false`: nothing validates.
	never                bool
	Type                 string           `json:"type"`
	Enum                 []any            `json:"enum"`
	Const                any              `json:"const"`
	Properties           map[string]*node `json:"properties"`
	Required             []string         `json:"required"`
	AdditionalProperties *node            `json:"additionalProperties"`
	PatternProperties    map[string]*node `json:"patternProperties"`
	Items                *node            `json:"items"`
	OneOf                []*node          `json:"oneOf"`
	Format               string           `json:"format"`
	AnyOf                []*node          `json:"anyOf"`
	// patterns are the compiled PatternProperties keys.
	patterns map[string]*regexp.Regexp
}

// UnmarshalJSON reads a schema object or one of the boolean schemas true and false.
func (n *node) UnmarshalJSON(data []byte) error {
	switch string(bytes.TrimSpace(data)) {
	case "true":
		*n = node{}
		return nil
	case "false":
		*n = node{never: true}
		return nil
	}
	type plain node
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return dec.Decode((*plain)(n))
}

// compileSchema parses a JSON schema into a node tree and compiles its patterns.
func compileSchema(schema []byte) (*node, error) {
	var n node
	if err := json.Unmarshal(schema, &n); err != nil {
		return nil, err
	}
	if err := n.compile(); err != nil {
		return nil, err
	}
	return &n, nil
}

func (n *node) compile() error {
	if n == nil {
		return nil
	}
	for pat, sub := range n.PatternProperties {
		re, err := regexp.Compile(pat)
		if err != nil {
			return fmt.Errorf("patternProperties %q: %w", pat, err)
		}
		if n.patterns == nil {
			n.patterns = map[string]*regexp.Regexp{}
		}
		n.patterns[pat] = re
		if err := sub.compile(); err != nil {
			return err
		}
	}
	for _, sub := range n.Properties {
		if err := sub.compile(); err != nil {
			return err
		}
	}
	for _, sub := range slices.Concat([]*node{n.AdditionalProperties, n.Items}, n.OneOf, n.AnyOf) {
		if err := sub.compile(); err != nil {
			return err
		}
	}
	return nil
}

// validate checks v (decoded with UseNumber) against n and returns an error naming the
// field by its JSON pointer ("/customer/email"; "" is the whole input), or nil.
func (n *node) validate(path string, v any) error {
	if n == nil {
		return nil
	}
	if n.never {
		return fieldErr(path, "is not allowed")
	}
	if len(n.OneOf) > 0 || len(n.AnyOf) > 0 {
		alts := n.OneOf
		if len(alts) == 0 {
			alts = n.AnyOf
		}
		var first error
		ok := false
		for _, alt := range alts {
			if err := alt.validate(path, v); err == nil {
				ok = true
				break
			} else if first == nil {
				first = err
			}
		}
		if !ok {
			return first
		}
	}
	if n.Type != "" {
		if got := jsonType(v); !typeMatches(n.Type, got, v) {
			return fieldErr(path, "must be %s, got %s", article(n.Type), article(got))
		}
	}
	if len(n.Enum) > 0 && !containsJSON(n.Enum, v) {
		return fieldErr(path, "must be one of %s", listJSON(n.Enum))
	}
	if n.Const != nil && !containsJSON([]any{n.Const}, v) {
		return fieldErr(path, "must be %s", listJSON([]any{n.Const}))
	}
	if s, ok := v.(string); ok && n.Format == "date-time" {
		if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
			return fieldErr(path, "must be an RFC 3339 date-time, got %q", s)
		}
	}
	switch t := v.(type) {
	case map[string]any:
		return n.validateObject(path, t)
	case []any:
		for i, item := range t {
			if err := n.Items.validate(fmt.Sprintf("%s/%d", path, i), item); err != nil {
				return err
			}
		}
	}
	return nil
}

func (n *node) validateObject(path string, obj map[string]any) error {
	for _, name := range n.Required {
		if _, ok := obj[name]; !ok {
			return fieldErr(path+"/"+escapeToken(name), "is required")
		}
	}
	names := make([]string, 0, len(obj))
	for name := range obj {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		sub := path + "/" + escapeToken(name)
		matched := false
		if s, ok := n.Properties[name]; ok {
			matched = true
			if err := s.validate(sub, obj[name]); err != nil {
				return err
			}
		}
		for pat, re := range n.patterns {
			if re.MatchString(name) {
				matched = true
				if err := n.PatternProperties[pat].validate(sub, obj[name]); err != nil {
					return err
				}
			}
		}
		if matched || n.AdditionalProperties == nil {
			continue
		}
		if n.AdditionalProperties.never {
			return fieldErr(sub, "is not a known field (known: %s)", strings.Join(sortedKeys(n.Properties), ", "))
		}
		if err := n.AdditionalProperties.validate(sub, obj[name]); err != nil {
			return err
		}
	}
	return nil
}

func fieldErr(path, format string, args ...any) error {
	field := path
	if field == "" {
		field = "the input"
	} else {
		field = fmt.Sprintf("field %q", field)
	}
	return inputErr(ErrInvalidInput, "", "%s %s", field, fmt.Sprintf(format, args...))
}

// jsonType names the JSON type of v: object, array, string, number, boolean or null.
func jsonType(v any) string {
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// typeMatches reports whether a value of JSON type got satisfies the schema type want. An
// integer is a number written without fraction or exponent, which is what Go decodes into
// its integer types.
func typeMatches(want, got string, v any) bool {
	if want == got {
		return true
	}
	if want == "integer" && got == "number" {
		return !strings.ContainsAny(v.(json.Number).String(), ".eE")
	}
	return false
}

func article(t string) string {
	switch t {
	case "object", "array", "integer":
		return "an " + t
	case "null":
		return "null"
	}
	return "a " + t
}

func containsJSON(list []any, v any) bool {
	want, ok := canonicalOf(v)
	if !ok {
		return false
	}
	for _, e := range list {
		if c, ok := canonicalOf(e); ok && c == want {
			return true
		}
	}
	return false
}

func canonicalOf(v any) (string, bool) {
	raw, err := json.Marshal(v)
	if err != nil {
		return "", false
	}
	c, err := residual.Canonical(raw)
	return string(c), err == nil
}

func listJSON(list []any) string {
	parts := make([]string, 0, len(list))
	for _, e := range list {
		raw, _ := json.Marshal(e)
		parts = append(parts, string(raw))
	}
	return strings.Join(parts, ", ")
}

func sortedKeys(m map[string]*node) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// escapeToken escapes a member name as an RFC 6901 reference token.
func escapeToken(name string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(name)
}
