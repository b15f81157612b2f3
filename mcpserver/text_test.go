package mcpserver

import "testing"

func TestCheckText(t *testing.T) {
	t.Parallel()
	for raw, bad := range map[string]bool{
		`{"target":"invoice:1"}`:              false,
		`{"target":"caf\u00e9 \ud83d\ude00"}`: false,
		"{\"target\":\"\xef\xbf\xbd\"}":       false, // a real U+FFFD is a character like any other
		`{"target":"\ufffd"}`:                 false,
		`{"a":"\\u00"}`:                       false, // an escaped backslash, then text
		"{\"target\":\"\xff\"}":               true,
		"{\"target\":\"\xfe\"}":               true,
		`{"target":"\ud800"}`:                 true,
		`{"target":"\udc00"}`:                 true,
		`{"target":"\ud800x"}`:                true,
		`{"target":"\ud800\n"}`:               true,
		`{"target":"\ud800\u0041"}`:           true,
	} {
		if err := checkText([]byte(raw)); (err != nil) != bad {
			t.Errorf("checkText(%q) = %v, want refused=%v", raw, err, bad)
		}
	}
}

// FuzzCheckText: checkText never panics, and accepts whatever encoding/json produces.
func FuzzCheckText(f *testing.F) {
	f.Add([]byte(`{"target":"\ud800\udc00"}`))
	f.Add([]byte("{\"a\":\"\xff\"}"))
	f.Add([]byte(`"\`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		_ = checkText(raw)
	})
}
