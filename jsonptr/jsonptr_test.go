package jsonptr

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func mustPointers(t *testing.T, texts ...string) []Pointer {
	t.Helper()
	var ps []Pointer
	for _, s := range texts {
		p, err := Parse(s)
		require.NoError(t, err, s)
		ps = append(ps, p)
	}
	return ps
}

// The examples of RFC 6901 section 5.
func TestPointerRFC6901Examples(t *testing.T) {
	t.Parallel()
	doc, err := Decode([]byte(`{
	  "foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4,
	  "i\\j": 5, "k\"l": 6, " ": 7, "m~n": 8}`))
	require.NoError(t, err)
	cases := map[string]string{
		"/foo/0": "bar", "/": "0", "/a~1b": "1", "/c%d": "2", "/e^f": "3", "/g|h": "4",
		"/i\\j": "5", "/k\"l": "6", "/ ": "7", "/m~0n": "8", "/foo": `["bar","baz"]`,
	}
	for text, want := range cases {
		got, err := Extract("t", mustPointers(t, text), doc)
		require.NoError(t, err, text)
		require.Equal(t, want, got, text)
	}
	whole, err := Extract("t", mustPointers(t, ""), doc)
	require.NoError(t, err)
	require.Contains(t, whole, `"m~n":8`)
}

func TestParsePointerRejectsMalformed(t *testing.T) {
	t.Parallel()
	for _, text := range []string{"foo", "/a~", "/a~2b", "#/a"} {
		_, err := Parse(text)
		require.ErrorIs(t, err, ErrInvalidPointer, text)
		require.ErrorContains(t, err, text)
	}
	p, err := Parse("/~01")
	require.NoError(t, err)
	require.Equal(t, []string{"~1"}, p.tokens, "~01 decodes to ~1, not /")
}

func TestExtractTargetMissingNamesPointerAndTool(t *testing.T) {
	t.Parallel()
	doc, err := Decode([]byte(`{"invoice":{"id":"INV-1","lines":[1]},"empty":"","nothing":null}`))
	require.NoError(t, err)
	for _, text := range []string{"/invoice_id", "/invoice/number", "/invoice/lines/1", "/invoice/lines/-", "/invoice/lines/01", "/invoice/id/x"} {
		_, err := Extract("charge_invoice", mustPointers(t, "/invoice/id", text), doc)
		require.ErrorIs(t, err, ErrNoTarget, text)
		require.ErrorContains(t, err, `JSON pointer "`+text+`" is not in the input`)
		require.ErrorContains(t, err, `tool "charge_invoice"`)
	}
	for _, text := range []string{"/empty", "/nothing"} {
		_, err := Extract("charge_invoice", mustPointers(t, text), doc)
		require.ErrorIs(t, err, ErrNoTarget)
		require.ErrorContains(t, err, `JSON pointer "`+text+`" is null or empty`)
	}
}

func TestExtractTargetJoinsUnambiguously(t *testing.T) {
	t.Parallel()
	target := func(input string, ptrs ...string) string {
		doc, err := Decode([]byte(input))
		require.NoError(t, err)
		got, err := Extract("t", mustPointers(t, ptrs...), doc)
		require.NoError(t, err)
		return got
	}
	// Separators inside values cannot make two inputs collide.
	a := target(`{"x":"a:b","y":"c"}`, "/x", "/y")
	b := target(`{"x":"a","y":"b:c"}`, "/x", "/y")
	require.NotEqual(t, a, b)
	require.Equal(t, `["a:b","c"]`, a)
	c := target(`{"x":"a\",\"b","y":"c"}`, "/x", "/y")
	d := target(`{"x":"a","y":"b\",\"c"}`, "/x", "/y")
	require.NotEqual(t, c, d)
	// Numbers are canonical: 42, 42.0 and 4.2e1 are one target; objects ignore key order.
	require.Equal(t, "42", target(`{"n":42}`, "/n"))
	require.Equal(t, "42", target(`{"n":42.0}`, "/n"))
	require.Equal(t, "42", target(`{"n":4.2e1}`, "/n"))
	require.Equal(t, target(`{"o":{"a":1,"b":2}}`, "/o"), target(`{"o":{"b":2,"a":1}}`, "/o"))
	// A single string is itself.
	require.Equal(t, "bob@example.com", target(`{"to":"bob@example.com"}`, "/to"))
}

func TestDecodeJSONRejectsTrailingData(t *testing.T) {
	t.Parallel()
	_, err := Decode([]byte(`{"a":1} {"b":2}`))
	require.Error(t, err)
	_, err = Decode([]byte(`charge INV-42`))
	require.Error(t, err)
}
