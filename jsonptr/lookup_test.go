package jsonptr_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/jsonptr"
	"github.com/toolfence/toolfence/residual"
)

func TestLookup(t *testing.T) {
	t.Parallel()
	doc := []byte(`{"a": {"b/c": [1, {"d": null}]}, "n": 0}`)
	v, ok, err := jsonptr.Lookup("/a/b~1c/0", doc)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, json.Number("1"), v)
	v, ok, err = jsonptr.Lookup("/a/b~1c/1/d", doc)
	require.NoError(t, err)
	require.True(t, ok, "a null value is there")
	require.Nil(t, v)
	_, ok, err = jsonptr.Lookup("/a/x", doc)
	require.NoError(t, err)
	require.False(t, ok)
	_, _, err = jsonptr.Lookup("a", doc)
	require.ErrorIs(t, err, jsonptr.ErrInvalidPointer)
	_, _, err = jsonptr.Lookup("/a", []byte(`{`))
	require.ErrorIs(t, err, residual.ErrInvalidJSON)
}
