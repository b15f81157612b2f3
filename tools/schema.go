package tools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/toolfence/toolfence/jsonptr"
)

// schemaURL is where a typed tool's input schema is registered with its compiler; every
// tool has a compiler of its own, so the name never clashes.
const schemaURL = "urn:toolfence:tool-input"

// maxReported is how many offending fields one error names.
const maxReported = 5

// printer renders the validator's messages for keywords validate has no wording of its own for.
var printer = message.NewPrinter(language.English)

// inputSchema is a typed tool's input schema compiled once with santhosh-tekuri/jsonschema
// (JSON Schema 2020-12, every keyword, format assertions on). It is safe for concurrent use.
type inputSchema struct {
	compiled *jsonschema.Schema
	// doc is the schema as decoded, to list the known fields of an object in errors.
	doc any
}

// compileSchema compiles a JSON schema with format assertions enabled (email, date-time,
// uri… are checked, not just annotated). It returns an error when the schema is not valid
// JSON or not a valid schema.
func compileSchema(schema []byte) (*inputSchema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, err
	}
	compiled, err := c.Compile(schemaURL)
	if err != nil {
		return nil, err
	}
	return &inputSchema{compiled: compiled, doc: doc}, nil
}

// validate checks v (decoded with UseNumber) against the schema. It returns nil, or an error
// wrapping ErrInvalidInput whose detail names each offending field by its JSON pointer
// ("/customer/email"; the whole input is "the input"), up to maxReported of them, in
// pointer order.
func (s *inputSchema) validate(tool string, v any) error {
	err := s.compiled.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return inputErr(ErrInvalidInput, tool, "%v", err)
	}
	var problems []fieldProblem
	s.collect(ve, &problems)
	slices.SortStableFunc(problems, func(a, b fieldProblem) int { return strings.Compare(a.pointer, b.pointer) })
	problems = slices.CompactFunc(problems, func(a, b fieldProblem) bool { return a == b })
	parts := make([]string, 0, maxReported+1)
	fields := make([]string, 0, len(problems))
	for i, p := range problems {
		fields = append(fields, p.pointer)
		if i < maxReported {
			parts = append(parts, p.String())
		}
	}
	if len(problems) > maxReported {
		parts = append(parts, fmt.Sprintf("and %d more", len(problems)-maxReported))
	}
	return &InputError{Kind: ErrInvalidInput, Tool: tool, Detail: strings.Join(parts, "; "), Fields: fields}
}

// fieldProblem is one offending field and what is wrong with it.
type fieldProblem struct {
	pointer string
	what    string
}

func (p fieldProblem) String() string {
	if p.pointer == "" {
		return "the input " + p.what
	}
	return fmt.Sprintf("field %q %s", p.pointer, p.what)
}

// collect appends the problems of the leaves of e. Of alternatives (anyOf, oneOf) only the
// first alternative's problems are shown: listing every alternative's would bury the point.
func (s *inputSchema) collect(e *jsonschema.ValidationError, out *[]fieldProblem) {
	switch e.ErrorKind.(type) {
	case *kind.AnyOf, *kind.OneOf:
		if len(e.Causes) > 0 {
			s.collect(e.Causes[0], out)
			return
		}
	}
	if len(e.Causes) > 0 {
		for _, c := range e.Causes {
			s.collect(c, out)
		}
		return
	}
	at := pointerOf(e.InstanceLocation)
	switch k := e.ErrorKind.(type) {
	case *kind.Required:
		for _, name := range k.Missing {
			*out = append(*out, fieldProblem{at + "/" + escapeToken(name), "is required"})
		}
	case *kind.AdditionalProperties:
		known := s.knownFields(e.SchemaURL)
		for _, name := range k.Properties {
			what := "is not a known field"
			if len(known) > 0 {
				what += " (known: " + strings.Join(known, ", ") + ")"
			}
			*out = append(*out, fieldProblem{at + "/" + escapeToken(name), what})
		}
	default:
		*out = append(*out, fieldProblem{at, describeKind(e.ErrorKind)})
	}
}

// describeKind words one failed keyword as the rest of a sentence that starts with the field.
func describeKind(k jsonschema.ErrorKind) string {
	switch k := k.(type) {
	case *kind.Type:
		want := make([]string, len(k.Want))
		for i, w := range k.Want {
			want[i] = article(w)
		}
		got := k.Got
		if got == "integer" { // the validator's name for a number without a fraction
			got = "number"
		}
		return fmt.Sprintf("must be %s, got %s", strings.Join(want, " or "), article(got))
	case *kind.Enum:
		if len(k.Want) == 1 {
			return "must be " + listJSON(k.Want)
		}
		return "must be one of " + listJSON(k.Want)
	case *kind.Const:
		return "must be " + listJSON([]any{k.Want})
	case *kind.Format:
		return fmt.Sprintf("must be %s, got %s", formatName(k.Want), listJSON([]any{k.Got}))
	case *kind.MinLength:
		return fmt.Sprintf("must be at least %d characters long, got %d", k.Want, k.Got)
	case *kind.MaxLength:
		return fmt.Sprintf("must be at most %d characters long, got %d", k.Want, k.Got)
	case *kind.Pattern:
		return fmt.Sprintf("must match the pattern %s, got %q", k.Want, k.Got)
	case *kind.Minimum:
		return fmt.Sprintf("must be at least %s, got %s", ratString(k.Want), ratString(k.Got))
	case *kind.Maximum:
		return fmt.Sprintf("must be at most %s, got %s", ratString(k.Want), ratString(k.Got))
	case *kind.ExclusiveMinimum:
		return fmt.Sprintf("must be greater than %s, got %s", ratString(k.Want), ratString(k.Got))
	case *kind.ExclusiveMaximum:
		return fmt.Sprintf("must be less than %s, got %s", ratString(k.Want), ratString(k.Got))
	case *kind.MultipleOf:
		return fmt.Sprintf("must be a multiple of %s, got %s", ratString(k.Want), ratString(k.Got))
	case *kind.MinItems:
		return fmt.Sprintf("must have at least %d items, got %d", k.Want, k.Got)
	case *kind.MaxItems:
		return fmt.Sprintf("must have at most %d items, got %d", k.Want, k.Got)
	case *kind.UniqueItems:
		return fmt.Sprintf("must not repeat items (items %d and %d are equal)", k.Duplicates[0], k.Duplicates[1])
	case *kind.MinProperties:
		return fmt.Sprintf("must have at least %d fields, got %d", k.Want, k.Got)
	case *kind.MaxProperties:
		return fmt.Sprintf("must have at most %d fields, got %d", k.Want, k.Got)
	case *kind.FalseSchema:
		return "is not allowed"
	}
	return "is invalid: " + k.LocalizedString(printer)
}

// formatName names a JSON Schema format for a sentence ("an email address").
func formatName(format string) string {
	switch format {
	case "date-time":
		return "an RFC 3339 date-time"
	case "date":
		return "an RFC 3339 date (2006-01-02)"
	case "time":
		return "an RFC 3339 time (15:04:05Z)"
	case "email":
		return "an email address"
	case "uri":
		return "an absolute URI"
	case "uuid":
		return "a UUID"
	case "hostname":
		return "a hostname"
	case "ipv4", "ipv6":
		return "an " + strings.ToUpper(format[:2]) + format[2:] + " address"
	}
	return "a valid " + format
}

// ratString writes a number of the schema or the input as JSON would.
func ratString(r *big.Rat) string {
	if r.IsInt() {
		return r.Num().String()
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// knownFields lists the property names of the schema at schemaURL (the object whose
// additionalProperties failed), sorted; nil when it cannot be found.
func (s *inputSchema) knownFields(at string) []string {
	_, frag, _ := strings.Cut(at, "#")
	frag, err := url.PathUnescape(frag)
	if err != nil {
		return nil
	}
	node := s.doc
	if frag != "" {
		p, err := jsonptr.Parse(frag)
		if err != nil {
			return nil
		}
		for _, tok := range p.Tokens() {
			m, ok := node.(map[string]any)
			if !ok {
				return nil
			}
			node = m[tok]
		}
	}
	m, _ := node.(map[string]any)
	props, _ := m["properties"].(map[string]any)
	names := make([]string, 0, len(props))
	for name := range props {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// pointerOf writes reference tokens as an RFC 6901 JSON pointer.
func pointerOf(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(escapeToken(t))
	}
	return b.String()
}

// article puts "a" or "an" before a JSON type name ("null" goes alone).
func article(t string) string {
	switch t {
	case "object", "array", "integer":
		return "an " + t
	case "null":
		return "null"
	}
	return "a " + t
}

// listJSON writes values as JSON, comma-separated.
func listJSON(list []any) string {
	parts := make([]string, 0, len(list))
	for _, e := range list {
		raw, _ := json.Marshal(e)
		parts = append(parts, string(raw))
	}
	return strings.Join(parts, ", ")
}

// escapeToken escapes a member name as an RFC 6901 reference token.
func escapeToken(name string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(name)
}
