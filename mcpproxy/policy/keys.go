package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// checkKeys refuses a policy document (JSON) in which one object repeats a key, or a
// key of a rule differs from the rule's own key only in case ("Mode"), or names none of
// them: encoding/json keeps the last of repeated keys and matches keys regardless of case,
// so {"mode": "protect", "Mode": "bypass"} or a tool listed twice would otherwise decide a
// tool's protection by key order, and differently for a YAML file (whose keys are sorted
// on the way to JSON). The error names where the key is: the tool, and the rule within it.
func checkKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkKeys(dec, reflect.TypeFor[Policy](), "")
}

// unmarshalerType is the type of a value that decodes itself (Duration): a leaf.
var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// walkKeys reads the next JSON value from dec and checks the keys of its objects against t,
// the Go type it decodes into: a struct's keys must be its fields' JSON names exactly, a
// map's keys must not repeat. where says where the value is, for errors ("" at the top).
// Values of other shapes are skipped: the decoder reports a wrong type after this.
func walkKeys(dec *json.Decoder, t reflect.Type, where string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	delim, isDelim := tok.(json.Delim)
	leaf := reflect.PointerTo(t).Implements(unmarshalerType)
	switch {
	case !isDelim:
		return nil // a scalar
	case delim == '[' && t.Kind() == reflect.Slice && !leaf:
		for dec.More() {
			if err := walkKeys(dec, t.Elem(), where); err != nil {
				return err
			}
		}
		_, err := dec.Token()
		return err
	case delim == '{' && (t.Kind() == reflect.Struct || t.Kind() == reflect.Map) && !leaf:
	default:
		return skipRest(dec, delim)
	}
	names := map[string]reflect.Type{} // a struct's JSON names → field types
	if t.Kind() == reflect.Struct {
		for i := range t.NumField() {
			f := t.Field(i)
			if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); f.IsExported() && name != "" && name != "-" {
				names[name] = f.Type
			}
		}
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		if seen[key] {
			return &keyError{fmt.Sprintf("%skey %q is given twice", prefix(where), key)}
		}
		seen[key] = true
		elem, inner := t, where
		if t.Kind() == reflect.Map {
			elem = t.Elem()
			inner = child(where, t, key)
		} else {
			ft, ok := names[key]
			if !ok {
				return unknownKey(where, key, names)
			}
			elem, inner = ft, child(where, t, key)
		}
		if err := walkKeys(dec, elem, inner); err != nil {
			return err
		}
	}
	_, err = dec.Token()
	return err
}

// skipRest reads the rest of the array or object that delim opened.
func skipRest(dec *json.Decoder, delim json.Delim) error {
	for depth := 1; depth > 0; {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			depth++
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
	}
	return nil
}

// child is where the value of key in an object of type t (at where) is: a tool of the
// tools map is `tool "NAME"`, a rule within it `tool "NAME": probe`.
func child(where string, t reflect.Type, key string) string {
	switch {
	case where == "tools":
		return fmt.Sprintf("tool %q", key)
	case where == "":
		return key
	case t.Kind() == reflect.Map:
		return fmt.Sprintf("%s %q", where, key)
	}
	return where + ": " + key
}

func prefix(where string) string {
	if where == "" {
		return ""
	}
	return where + ": "
}

// unknownKey is the error of a key that is none of names: a case variant of one of them is
// named as such.
func unknownKey(where, key string, names map[string]reflect.Type) error {
	known := sortedKeys(names)
	for _, n := range known {
		if strings.EqualFold(n, key) {
			return &keyError{fmt.Sprintf("%skey %q: write it %q (keys are case-sensitive)", prefix(where), key, n)}
		}
	}
	return &keyError{fmt.Sprintf("%sunknown key %q (want one of: %s)", prefix(where), key, strings.Join(known, ", "))}
}

// keyError is a key that checkKeys refuses. Its other errors are the JSON syntax
// errors, which the decoder then reports in its own words.
type keyError struct{ msg string }

func (e *keyError) Error() string { return e.msg }

// decodeStrict decodes data, one JSON object, into v, refusing unknown fields and trailing
// data; its errors are made by errf, what naming the object in them ("policy", "pins").
func decodeStrict(data []byte, v any, what string, errf func(string, ...any) error) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errf("%w", err)
	}
	if dec.More() {
		return errf("trailing data after the %s object", what)
	}
	return nil
}
