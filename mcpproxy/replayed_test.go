package mcpproxy

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpwire"
)

// replayDoc is a replay as the host reads it.
type replayDoc struct {
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StructuredContent json.RawMessage            `json:"structuredContent"`
	Meta              map[string]json.RawMessage `json:"_meta"`
}

func replayOf(t *testing.T, output string) (*interceptor.Result, replayDoc, map[string]json.RawMessage) {
	t.Helper()
	return replayOfResult(t, &interceptor.Result{Key: "tf1_k", Output: []byte(output), Replayed: true, Attempt: 1, Token: 7,
		RecordedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)})
}

func replayOfResult(t *testing.T, res *interceptor.Result) (*interceptor.Result, replayDoc, map[string]json.RawMessage) {
	t.Helper()
	raw := replayed(res, "")
	var doc replayDoc
	require.NoError(t, json.Unmarshal(raw, &doc), string(raw))
	var top map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &top))
	require.Equal(t, "true", string(doc.Meta[mcpwire.MetaReplayed]), string(raw))
	require.Contains(t, doc.Meta, mcpwire.MetaCall)
	return res, doc, top
}

func texts(doc replayDoc) []string {
	var out []string
	for _, c := range doc.Content {
		out = append(out, c.Type+":"+c.Text)
	}
	return out
}

// TestReplayOfAResolvedObjectIsAToolResult: an operator's `toolfence resolve --result` object
// is not a CallToolResult; the host gets one: the note, the object as a text block the model
// reads, and the object as structuredContent, not its fields spread over the result.
func TestReplayOfAResolvedObjectIsAToolResult(t *testing.T) {
	obj := `{"charge_id":"ch_3","order_id":"ORD-3","amount_cents":900}`
	res, doc, top := replayOf(t, obj)
	require.Equal(t, []string{"text:" + replayNote(res, ""), "text:" + obj}, texts(doc))
	require.JSONEq(t, obj, string(doc.StructuredContent))
	for k := range top {
		require.Contains(t, []string{"content", "structuredContent", "_meta"}, k)
	}
	// An object whose "content" is not an array is not a CallToolResult either.
	obj = `{"content":"sent","id":1}`
	res, doc, _ = replayOf(t, obj)
	require.Equal(t, []string{"text:" + replayNote(res, ""), "text:" + obj}, texts(doc))
	require.JSONEq(t, obj, string(doc.StructuredContent))
}

// TestReplayOfAResolvedScalarIsText: a JSON string, number or array is shown as text after
// the note, with no structuredContent (which must be an object); so is a cut result, whose
// JSON is not whole.
func TestReplayOfAResolvedScalarIsText(t *testing.T) {
	for _, out := range []string{`"sent ok"`, `42`, `["a","b"]`} {
		res, doc, _ := replayOf(t, out)
		require.Equal(t, []string{"text:" + replayNote(res, ""), "text:" + out}, texts(doc), out)
		require.Empty(t, doc.StructuredContent, out)
	}
	cut := `{"content":[{"type":"text","text":"char`
	res, doc, _ := replayOfResult(t, &interceptor.Result{Key: "tf1_k", Output: []byte(cut), Truncated: true, RecordedAt: time.Now()})
	require.Equal(t, []string{"text:" + replayNote(res, ""), "text:" + cut}, texts(doc))
	require.Contains(t, doc.Content[0].Text, "(result truncated)")
	require.Empty(t, doc.StructuredContent)
}

// TestReplayOfAnEmptyResultIsTheNoteAlone: a call resolved as succeeded without --result
// replays the note, with no dangling ": " and no empty block.
func TestReplayOfAnEmptyResultIsTheNoteAlone(t *testing.T) {
	res, doc, _ := replayOf(t, "")
	require.Equal(t, []string{"text:" + replayNote(res, "")}, texts(doc))
	require.Empty(t, doc.StructuredContent)
}

// TestReplayOfAToolResultKeepsItsShape: a recorded CallToolResult is given back as it was,
// the note first, upstream's _meta merged with toolfence's, other fields kept.
func TestReplayOfAToolResultKeepsItsShape(t *testing.T) {
	rec := `{"content":[{"type":"text","text":"charged"},{"type":"image","data":"AA==","mimeType":"image/png"}],` +
		`"structuredContent":{"charge_id":"ch_1"},"_meta":{"up":1},"extra":"kept"}`
	res, doc, top := replayOf(t, rec)
	require.Equal(t, []string{"text:" + replayNote(res, ""), "text:charged", "image:"}, texts(doc))
	require.JSONEq(t, `{"charge_id":"ch_1"}`, string(doc.StructuredContent))
	require.Equal(t, "1", string(doc.Meta["up"]))
	require.Equal(t, `"kept"`, string(top["extra"]))
	// An empty content array is still a CallToolResult.
	res, doc, top = replayOf(t, `{"content":[],"structuredContent":{"found":true}}`)
	require.Equal(t, []string{"text:" + replayNote(res, "")}, texts(doc))
	require.JSONEq(t, `{"found":true}`, string(doc.StructuredContent))
	require.Len(t, top, 3)
}

// TestReplayOfAToolResultWithoutContentKeepsItsShape: a server that left "content" out of a
// result with structuredContent (classify records it as succeeded) is replayed in its shape:
// its structuredContent and _meta where they were, the note as its content; not nested as
// the structuredContent of a wrapper, which a host checking outputSchema would refuse.
func TestReplayOfAToolResultWithoutContentKeepsItsShape(t *testing.T) {
	res, doc, top := replayOf(t, `{"structuredContent":{"id":1},"_meta":{"example.com/x":1}}`)
	require.Equal(t, []string{"text:" + replayNote(res, "")}, texts(doc))
	require.JSONEq(t, `{"id":1}`, string(doc.StructuredContent))
	require.Equal(t, "1", string(doc.Meta["example.com/x"]))
	require.Len(t, top, 3)
	_, doc, _ = replayOf(t, `{"isError":false}`)
	require.Nil(t, doc.StructuredContent, "an object with isError is a result, not an operator's value")
}
