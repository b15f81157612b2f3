package jsonptr

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/toolfence/toolfence/residual"
)

// Errors of pointers and targets.
var (
	// ErrInvalidPointer: a declared pointer is not a valid RFC 6901 JSON pointer.
	ErrInvalidPointer = errors.New("jsonptr: invalid JSON pointer")
	// ErrNoTarget: a declared target pointer is missing from the input, or its value is
	// null or empty.
	ErrNoTarget = errors.New("jsonptr: target not found in input")
)

// Error is a target that could not be extracted from a call's input. It wraps Kind
// (ErrNoTarget, or residual.ErrInvalidJSON for an input that is not JSON) for errors.Is;
// Detail says which pointer failed, and Tool names the tool.
type Error struct {
	Kind   error
	Tool   string
	Detail string
}

// Error returns the kind, the tool and the detail.
func (e *Error) Error() string {
	if e.Tool == "" {
		return e.Kind.Error() + ": " + e.Detail
	}
	return fmt.Sprintf("%v: tool %q: %s", e.Kind, e.Tool, e.Detail)
}

// Unwrap returns the kind.
func (e *Error) Unwrap() error { return e.Kind }

func targetErr(kind error, tool, format string, args ...any) error {
	return &Error{Kind: kind, Tool: tool, Detail: fmt.Sprintf(format, args...)}
}

// String returns the pointer's text.
func (p Pointer) String() string { return p.text }

// Tokens returns the pointer's reference tokens, unescaped.
func (p Pointer) Tokens() []string { return p.tokens }

// Pointer is a parsed RFC 6901 JSON pointer: its reference tokens, unescaped.
type Pointer struct {
	text   string
	tokens []string
}

// Parse parses an RFC 6901 JSON pointer: "" (the whole document) or a sequence of
// "/"-prefixed reference tokens in which "~1" stands for "/" and "~0" for "~". Any other
// use of "~" is an error wrapping ErrInvalidPointer.
func Parse(text string) (Pointer, error) {
	p := Pointer{text: text}
	if text == "" {
		return p, nil
	}
	if text[0] != '/' {
		return p, fmt.Errorf("%w: %q does not start with \"/\"", ErrInvalidPointer, text)
	}
	for _, raw := range strings.Split(text[1:], "/") {
		var b strings.Builder
		for i := 0; i < len(raw); i++ {
			if raw[i] != '~' {
				b.WriteByte(raw[i])
				continue
			}
			if i+1 == len(raw) || raw[i+1] != '0' && raw[i+1] != '1' {
				return p, fmt.Errorf("%w: %q: \"~\" must be followed by 0 or 1", ErrInvalidPointer, text)
			}
			if raw[i+1] == '0' {
				b.WriteByte('~')
			} else {
				b.WriteByte('/')
			}
			i++
		}
		p.tokens = append(p.tokens, b.String())
	}
	return p, nil
}

// Eval returns the value doc holds at p (doc decoded with UseNumber), or ok false when a
// token names a missing member, an index out of range, "-" or a token that is not an index.
func (p Pointer) Eval(doc any) (v any, ok bool) {
	v = doc
	for _, tok := range p.tokens {
		switch cur := v.(type) {
		case map[string]any:
			if v, ok = cur[tok]; !ok {
				return nil, false
			}
		case []any:
			i, valid := arrayIndex(tok)
			if !valid || i >= len(cur) {
				return nil, false
			}
			v = cur[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// arrayIndex parses an RFC 6901 array index: "0" or digits without a leading zero.
func arrayIndex(tok string) (int, bool) {
	if tok == "" || len(tok) > 1 && tok[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(tok)
	return n, err == nil
}

// Decode decodes exactly one JSON value, keeping numbers as json.Number.
func Decode(input []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("trailing data after the JSON value")
	}
	return v, nil
}

// targetPart renders one target value: a string as itself, anything else as its canonical
// JSON (so 1.0 and 1 give the same target). Null and "" are refused.
func targetPart(v any) (string, bool) {
	switch t := v.(type) {
	case nil:
		return "", false
	case string:
		return t, t != ""
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return "", false
	}
	c, err := residual.Canonical(raw)
	if err != nil {
		return "", false
	}
	return string(c), true
}

// Extract evaluates the pointers on doc and joins their values into one target: a
// single pointer gives its value (see targetPart); several give the JSON array of their
// values as strings, which no choice of values can make ambiguous. A missing, null or empty
// value gives an error wrapping ErrNoTarget that names the pointer and the tool.
func Extract(tool string, ptrs []Pointer, doc any) (string, error) {
	parts := make([]string, 0, len(ptrs))
	for _, p := range ptrs {
		v, ok := p.Eval(doc)
		if !ok {
			return "", targetErr(ErrNoTarget, tool, "JSON pointer %q is not in the input", p.text)
		}
		s, ok := targetPart(v)
		if !ok {
			return "", targetErr(ErrNoTarget, tool, "JSON pointer %q is null or empty", p.text)
		}
		parts = append(parts, s)
	}
	if len(parts) == 1 {
		return parts[0], nil
	}
	joined, err := json.Marshal(parts)
	if err != nil {
		return "", targetErr(ErrNoTarget, tool, "%v", err)
	}
	return string(joined), nil
}

// Check returns nil when text is a valid RFC 6901 JSON pointer ("" or "/a/b~1c"), and
// otherwise an error wrapping ErrInvalidPointer that quotes it.
func Check(text string) error {
	_, err := Parse(text)
	return err
}

// Target extracts the target of a call of tool from its JSON input with the given RFC 6901
// pointers, by the rules of tools.WithTarget and of a proxy policy's target: one pointer gives its value (a string as itself,
// anything else as canonical JSON); several give the JSON array of their values. It returns
// an error wrapping ErrInvalidPointer for a bad pointer, an *Error wrapping
// residual.ErrInvalidJSON for input that is not one JSON value, or an *Error wrapping
// ErrNoTarget naming the pointer for a missing, null or empty value.
func Target(tool string, pointers []string, input []byte) (string, error) {
	ptrs := make([]Pointer, 0, len(pointers))
	for _, text := range pointers {
		p, err := Parse(text)
		if err != nil {
			return "", err
		}
		ptrs = append(ptrs, p)
	}
	doc, err := Decode(input)
	if err != nil {
		return "", targetErr(residual.ErrInvalidJSON, tool, "%v", err)
	}
	return Extract(tool, ptrs, doc)
}
