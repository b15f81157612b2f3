package jsonptr

import (
	"fmt"

	"github.com/toolfence/toolfence/residual"
)

// Lookup returns the value that the RFC 6901 JSON pointer ptr names in the JSON document
// doc, decoded (objects as map[string]any, arrays as []any, numbers as json.Number), and
// whether it is there. It returns an error wrapping ErrInvalidPointer for a bad pointer, or
// residual.ErrInvalidJSON when doc is not one JSON value.
func Lookup(ptr string, doc []byte) (any, bool, error) {
	p, err := Parse(ptr)
	if err != nil {
		return nil, false, err
	}
	v, err := Decode(doc)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %v", residual.ErrInvalidJSON, err)
	}
	got, ok := p.Eval(v)
	return got, ok, nil
}
