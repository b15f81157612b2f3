package transport

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// CancelledID reads the id a cancellation names, numbers and strings apart, and names none
// for params that do not carry one.
func TestCancelledID(t *testing.T) {
	for params, want := range map[string]any{
		`{"requestId":7,"reason":"timeout"}`: int64(7),
		`{"requestId":"a-1"}`:                "a-1",
		`{"reason":"no id"}`:                 nil,
		`{"requestId":{"x":1}}`:              nil,
		`not json`:                           nil,
	} {
		id, ok := CancelledID(json.RawMessage(params))
		require.Equal(t, want != nil, ok, params)
		if ok {
			require.Equal(t, want, id.Raw(), params)
		}
	}
}
