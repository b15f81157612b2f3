package tools

import "fmt"

// Lookup returns the value that the RFC 6901 JSON pointer ptr names in the JSON document
// doc, decoded (objects as map[string]any, arrays as []any, numbers as json.Number), and
// whether it is there. It returns an error wrapping ErrInvalidPointer for a bad pointer, or
// ErrInvalidInput when doc is not one JSON value.
func Lookup(ptr string, doc []byte) (any, bool, error) {
	p, err := parsePointer(ptr)
	if err != nil {
		return nil, false, err
	}
	v, err := decodeJSON(doc)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %v", ErrInvalidInput, err)
	}
	got, ok := p.eval(v)
	return got, ok, nil
}
