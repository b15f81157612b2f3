package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"

	"github.com/invopop/jsonschema"
	"github.com/tmc/langchaingo/llms"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/jsonptr"
)

// TagTarget is the struct tag that marks a typed tool's target fields:
// `toolfence:"target"`. Several tagged fields are joined as WithTarget joins pointers, in
// declaration order; tagged fields may sit in nested structs.
const TagTarget = "target"

// ErrInvalidTool is wrapped by New's errors: a bad name, a nil function, an input type that
// is not a struct or cannot be described by a JSON schema, or no target declared.
var ErrInvalidTool = errors.New("tools: invalid typed tool")

// namePattern is what function-calling APIs accept as a tool name.
var namePattern = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// Typed is a tool with a Go input type In and output type Out. Its input schema is reflected
// from In; its target comes from the `toolfence:"target"` fields of In (or the options). It
// is safe for concurrent use when its function is.
type Typed[In, Out any] struct {
	name        string
	description string
	fn          func(ctx context.Context, in In) (Out, error)
	schema      json.RawMessage
	validator   *inputSchema
	// input is the one-line argument shape Description appends (see describeInput).
	input    string
	pointers []string
	opts     []Option
}

// New returns a typed tool named name that runs fn. Its input schema is reflected from In
// with invopop/jsonschema (field names and `jsonschema` tags as invopop reads them; unknown
// fields are refused) and compiled once with santhosh-tekuri/jsonschema; inputs are validated
// against the whole schema (types, required fields, enum, bounds, lengths, patterns and
// formats such as email and date-time), and decoded into In, before anything is reserved. An
// Out of type string is the tool's output as is; any other Out is encoded as JSON. It returns an error wrapping ErrInvalidTool when name is not 1-64 letters, digits,
// '_' or '-', fn is nil, In is not a struct (or a pointer to one), In is recursive or holds
// channels, functions or complex numbers, a `toolfence` tag has another value than
// "target", or no target is declared (no tagged field, WithTarget or WithTargetFunc).
func New[In, Out any](name, description string, fn func(ctx context.Context, in In) (Out, error), opts ...Option) (*Typed[In, Out], error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %q: %s", ErrInvalidTool, name, fmt.Sprintf(format, args...))
	}
	if !namePattern.MatchString(name) {
		return nil, bad("the name must be 1-64 letters, digits, '_' or '-'")
	}
	if fn == nil {
		return nil, bad("nil function")
	}
	t := reflect.TypeFor[In]()
	st := t
	if st.Kind() == reflect.Pointer {
		st = st.Elem()
	}
	if st.Kind() != reflect.Struct {
		return nil, bad("the input type %s is not a struct", t)
	}
	if err := checkType(st, nil); err != nil {
		return nil, bad("input type %s: %v", t, err)
	}
	pointers, err := targetPointers(st, "", nil)
	if err != nil {
		return nil, bad("input type %s: %v", t, err)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if len(o.pointers) > 0 || o.targetFunc != nil {
		pointers = nil // the options decide
	} else if len(pointers) == 0 {
		return nil, bad("input type %s has no field tagged `toolfence:\"target\"` and no WithTarget or WithTargetFunc option", t)
	}
	schema, err := reflectSchema(st)
	if err != nil {
		return nil, bad("input type %s: %v", t, err)
	}
	validator, err := compileSchema(schema)
	if err != nil {
		return nil, bad("input type %s: schema: %v", t, err)
	}
	return &Typed[In, Out]{
		name: name, description: description, fn: fn, schema: schema, validator: validator,
		input:    describeInput(validator.doc),
		pointers: pointers, opts: opts,
	}, nil
}

// Name returns the tool's name.
func (t *Typed[In, Out]) Name() string { return t.name }

// Description returns the tool's description followed by the shape of its input, read from
// the schema, on one line: `<description> Input: a JSON object {"cents" integer, required,
// minimum 1, maximum 100000; …; no other fields}`. Agents that see only a tool's name and description (as
// langchaingo's do) learn every field, its type, whether it is required and its constraints
// from it. Definition carries the description alone, beside the schema itself.
func (t *Typed[In, Out]) Description() string {
	if t.description == "" {
		return t.input
	}
	return strings.TrimRight(t.description, " \n") + " " + t.input
}

// Schema returns the JSON schema of the tool's input (a copy).
func (t *Typed[In, Out]) Schema() json.RawMessage { return bytes.Clone(t.schema) }

// Definition returns the function-calling definition of the tool: its name, description (as
// given to New, without the input shape Description adds: the schema is its parameters) and
// input schema, for llms.WithTools.
func (t *Typed[In, Out]) Definition() llms.Tool {
	return llms.Tool{
		Type: "function",
		Function: &llms.FunctionDefinition{
			Name: t.name, Description: t.description, Parameters: t.Schema(),
		},
	}
}

// Tool returns the tool as a langchaingo tools.Tool guarded by ic: each call is validated
// against the schema, then runs through the interceptor as Guard describes. The extra
// options are applied after New's.
func (t *Typed[In, Out]) Tool(ic *interceptor.Interceptor, opts ...Option) *Guarded {
	all := make([]Option, 0, len(t.opts)+len(opts)+2)
	all = append(all, t.opts...)
	all = append(all, opts...)
	if len(t.pointers) > 0 {
		all = append(all, WithTarget(t.pointers...))
	}
	all = append(all, withCheck(t.Check))
	return Guard(&typedTool[In, Out]{t: t}, ic, all...)
}

// Check validates a JSON input against the tool's schema and decodes it into In. It returns
// nil, or an *InputError wrapping ErrInvalidInput whose detail names each offending field by
// its JSON pointer (its Fields list them).
func (t *Typed[In, Out]) Check(input []byte) error {
	_, err := t.decode(input)
	return err
}

func (t *Typed[In, Out]) decode(input []byte) (In, error) {
	var in In
	doc, err := jsonptr.Decode(input)
	if err != nil {
		return in, inputErr(ErrInvalidInput, t.name, "the input must be a JSON object: %v", err)
	}
	if err := t.validator.validate(t.name, doc); err != nil {
		return in, err
	}
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) && ute.Field != "" && strings.HasPrefix(ute.Value, "number") {
			// Valid for the schema, not for Go: 1.0 is an integer to JSON Schema but not to an
			// int, and 1e40 overflows one. encoding/json names the field by its dotted path,
			// without array indexes.
			ptr := "/" + strings.ReplaceAll(escapeToken(ute.Field), ".", "/")
			return in, &InputError{Kind: ErrInvalidInput, Tool: t.name, Fields: []string{ptr},
				Detail: fmt.Sprintf("field %q cannot hold %s: it takes a whole number within the range of Go's %s, written without a fraction or exponent",
					ptr, ute.Value, ute.Type)}
		}
		return in, inputErr(ErrInvalidInput, t.name, "%v", err)
	}
	return in, nil
}

// typedTool is the unguarded langchaingo face of a Typed tool.
type typedTool[In, Out any] struct{ t *Typed[In, Out] }

func (tt *typedTool[In, Out]) Name() string        { return tt.t.name }
func (tt *typedTool[In, Out]) Description() string { return tt.t.Description() }

func (tt *typedTool[In, Out]) Call(ctx context.Context, input string) (string, error) {
	in, err := tt.t.decode([]byte(input))
	if err != nil {
		return "", interceptor.NoEffect(err)
	}
	out, err := tt.t.fn(ctx, in)
	if s, ok := any(out).(string); ok {
		return s, err
	}
	raw, merr := json.Marshal(out)
	if merr != nil {
		// The effect may have happened; the output cannot be shown.
		return "", errors.Join(err, fmt.Errorf("tools: tool %q: encoding the output: %w", tt.t.name, merr))
	}
	return string(raw), err
}

// reflectSchema reflects the schema of a struct type as one self-contained tree.
func reflectSchema(t reflect.Type) (raw json.RawMessage, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("reflecting the schema: %v", p)
		}
	}()
	r := &jsonschema.Reflector{Anonymous: true, DoNotReference: true, ExpandedStruct: true}
	s := r.ReflectFromType(t)
	s.Version = ""
	return json.Marshal(s)
}

// checkType refuses types a JSON schema cannot describe, and recursive structs (which a
// schema without references cannot hold).
func checkType(t reflect.Type, path []reflect.Type) error {
	switch t.Kind() {
	case reflect.Chan, reflect.Func, reflect.Complex64, reflect.Complex128, reflect.UnsafePointer:
		return fmt.Errorf("%s cannot be encoded as JSON", t)
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return checkType(t.Elem(), path)
	case reflect.Map:
		if err := checkType(t.Key(), path); err != nil {
			return err
		}
		return checkType(t.Elem(), path)
	case reflect.Struct:
		for _, p := range path {
			if p == t {
				return fmt.Errorf("%s is recursive", t)
			}
		}
		path = append(path, t)
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() && !f.Anonymous || f.Tag.Get("json") == "-" {
				continue
			}
			if err := checkType(f.Type, path); err != nil {
				return fmt.Errorf("field %s: %w", f.Name, err)
			}
		}
	}
	return nil
}

// targetPointers returns the JSON pointers of the fields tagged `toolfence:"target"`, in
// declaration order, following encoding/json's naming and embedding rules.
func targetPointers(t reflect.Type, prefix string, seen []reflect.Type) ([]string, error) {
	for _, s := range seen {
		if s == t {
			return nil, nil
		}
	}
	seen = append(seen, t)
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, tagged := f.Tag.Lookup("toolfence")
		if tagged && tag != TagTarget {
			return nil, fmt.Errorf("field %s: unknown toolfence tag %q (want %q)", f.Name, tag, TagTarget)
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() && !f.Anonymous {
			if tagged {
				return nil, fmt.Errorf("field %s is tagged as a target but is not in the JSON input", f.Name)
			}
			continue
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct && !tagged {
			sub, err := targetPointers(ft, prefix, seen)
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
			continue
		}
		if name == "" {
			name = f.Name
		}
		ptr := prefix + "/" + escapeToken(name)
		switch {
		case tagged:
			out = append(out, ptr)
		case ft.Kind() == reflect.Struct:
			sub, err := targetPointers(ft, ptr, seen)
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
		}
	}
	return out, nil
}
