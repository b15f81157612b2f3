package tools

import (
	"errors"
	"fmt"

	"github.com/toolfence/toolfence/jsonptr"
	"github.com/toolfence/toolfence/residual"
)

// ErrInvalidInput: the input is not JSON (and WithOpaqueInput was not given) or does not
// match the tool's schema. Every error the package returns for a bad input wraps it or
// jsonptr.ErrNoTarget.
var ErrInvalidInput = errors.New("tools: invalid input")

// InputError is the error of an input refused before anything was reserved. It wraps Kind
// (jsonptr.ErrNoTarget or ErrInvalidInput) for errors.Is; Detail is what a model needs to correct
// the input, and is what observations show.
type InputError struct {
	Kind   error
	Tool   string
	Detail string
	// Fields are the JSON pointers of the offending fields of a typed tool's input ("" is the
	// whole input), in pointer order; nil for other errors.
	Fields []string
}

// Error returns the kind, the tool and the detail.
func (e *InputError) Error() string {
	if e.Tool == "" {
		return e.Kind.Error() + ": " + e.Detail
	}
	return fmt.Sprintf("%v: tool %q: %s", e.Kind, e.Tool, e.Detail)
}

// Unwrap returns the kind.
func (e *InputError) Unwrap() error { return e.Kind }

func inputErr(kind error, tool, format string, args ...any) error {
	return &InputError{Kind: kind, Tool: tool, Detail: fmt.Sprintf(format, args...)}
}

// asInputErr returns a jsonptr.Error of Extract as an *InputError (the kind of an input
// that is not JSON becomes ErrInvalidInput), and any other error as it is.
func asInputErr(err error) error {
	var pe *jsonptr.Error
	if !errors.As(err, &pe) {
		return err
	}
	kind := pe.Kind
	if errors.Is(kind, residual.ErrInvalidJSON) {
		kind = ErrInvalidInput
	}
	return &InputError{Kind: kind, Tool: pe.Tool, Detail: pe.Detail}
}
