package mcpproxy

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"
)

// The answers the bridge keeps for continuations stay within their bounds: the count, the
// bytes and the age; the oldest go first, and one taken by its continuation is not counted.
func TestLegacyUpFinishedBounded(t *testing.T) {
	l := &legacyUp{finished: map[string]finishedCall{}}
	answer := func(n int) *jsonrpc.Response {
		return &jsonrpc.Response{Result: json.RawMessage(`"` + strings.Repeat("x", n) + `"`)}
	}
	for i := range maxFinished + 10 {
		l.keepFinishedLocked("s"+strconv.Itoa(i), answer(1))
	}
	require.Len(t, l.finished, maxFinished)
	require.NotContains(t, l.finished, "s9", "the oldest went first")
	require.Contains(t, l.finished, "s10")

	l = &legacyUp{finished: map[string]finishedCall{}}
	big := maxFinishedBytes / 4
	for i := range 6 {
		l.keepFinishedLocked("b"+strconv.Itoa(i), answer(big))
	}
	require.LessOrEqual(t, l.bytes, maxFinishedBytes)
	require.Len(t, l.finished, 3, "three of a quarter each fit with the bytes of their quotes")
	l.forgetFinishedLocked("b5")
	require.Len(t, l.finished, 2)
	require.Equal(t, 2*(big+2), l.bytes)

	l = &legacyUp{finished: map[string]finishedCall{}}
	l.keepFinishedLocked("old", answer(1))
	f := l.finished["old"]
	f.at = f.at.Add(-DefaultRoundTimeout - time.Second)
	l.finished["old"] = f
	l.keepFinishedLocked("new", answer(1))
	require.NotContains(t, l.finished, "old", "older than a round can wait")
	require.Contains(t, l.finished, "new")
}
