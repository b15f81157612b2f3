package residual

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestCanonicalVectors(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		// Whitespace and key order.
		{"sorted keys", `{"b":1,"a":1.0}`, `{"a":1,"b":1}`},
		{"whitespace", `{ "a":1, "b":1 }`, `{"a":1,"b":1}`},
		{"all whitespace kinds", " \t\r\n[ 1 ,\n\t2 ] \r\n", `[1,2]`},
		{"empty object", `{ }`, `{}`},
		{"empty array", `[ ]`, `[]`},
		{"nested", `{"z":[{"y":2,"x":1},[],{}],"a":{"c":{"e":null,"d":true}}}`,
			`{"a":{"c":{"d":true,"e":null}},"z":[{"x":1,"y":2},[],{}]}`},
		{"prefix key first", `{"ab":1,"a":2,"":3}`, `{"":3,"a":2,"ab":1}`},
		{"key escapes compared decoded", `{"b":1,"\u0061":2}`, `{"a":2,"b":1}`},
		{"control key sorts before digits", `{"1":1,"\n":2}`, `{"\n":2,"1":1}`},
		// U+20AC (0x20AC) < U+1F600 (0xD83D 0xDE00) in UTF-16.
		{"euro before emoji", `{"\ud83d\ude00":2,"\u20ac":1}`, "{\"\u20ac\":1,\"\U0001F600\":2}"},
		// UTF-8 bytes order U+FF61 (EF BD A1) before U+1F600 (F0 9F 98 80),
		// but UTF-16 order puts 0xD83D before 0xFF61.
		{"utf16 differs from utf8", `{"\uff61":1,"\ud83d\ude00":2}`, "{\"\U0001F600\":2,\"\uff61\":1}"},
		{"utf16 differs from utf8 literal", "{\"\uff61\":1,\"\U0001F600\":2}", "{\"\U0001F600\":2,\"\uff61\":1}"},
		{"supplementary order", "{\"\U0001F601\":1,\"\U0001F600\":2,\"\U00010000\":3}",
			"{\"\U00010000\":3,\"\U0001F600\":2,\"\U0001F601\":1}"},
		// RFC 8785 §3.2.3 sorting example.
		{"rfc8785 sort", `{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}`,
			"{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"\u00f6\":\"Latin Small Letter O With Diaeresis\",\"\u20ac\":\"Euro Sign\",\"\U0001F600\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"},

		// Strings.
		{"escaped e acute", `"\u00e9"`, "\"\u00e9\""},
		{"literal e acute", "\"\u00e9\"", "\"\u00e9\""},
		{"solidus", `"a\/b"`, `"a/b"`},
		{"short escapes kept", `"\b\f\n\r\t\"\\"`, `"\b\f\n\r\t\"\\"`},
		{"short escapes from u", `"\u0008\u000C\u000a\u000D\u0009\u0022\u005C"`, `"\b\f\n\r\t\"\\"`},
		{"other controls lowercase hex", `"\u0000\u0001\u001F\u001b"`, `"\u0000\u0001\u001f\u001b"`},
		{"del and above literal", `"\u007f\u0080\u2028\u2029\ufeff\uFFFF"`, "\"\u007f\u0080\u2028\u2029\ufeff\uffff\""},
		{"html chars literal", `"\u003c\u003e\u0026<>&"`, `"<>&<>&"`},
		{"surrogate pair", `"\ud83d\ude00"`, "\"\U0001F600\""},
		{"surrogate pair upper hex", `"\uD83D\uDE00x"`, "\"\U0001F600x\""},
		{"literal replacement char", "\"\uFFFD\"", "\"\uFFFD\""},
		{"escaped replacement char", `"\ufffd"`, "\"\uFFFD\""},
		{"mixed escapes", `"a\u0062c\ndé\u00e9"`, "\"abc\\nd\u00e9\u00e9\""},
		{"empty string", `""`, `""`},

		// Numbers.
		{"1.0", `1.0`, `1`},
		{"1e2", `1e2`, `100`},
		{"0.10", `0.10`, `0.1`},
		{"-0", `-0`, `0`},
		{"-0.0", `-0.0`, `0`},
		{"0.0", `0.0`, `0`},
		{"0e10", `0e10`, `0`},
		{"-0E-7", `-0E-7`, `0`},
		{"0 with huge exp", `0.000e999999999999999999999999999`, `0`},
		{"1E+2", `1E+2`, `100`},
		{"100e-2", `100e-2`, `1`},
		{"1.5e300", `1.5e300`, `1.5e+300`},
		{"1e-300", `1e-300`, `1e-300`},
		{"negative sci", `-1.5E-300`, `-1.5e-300`},
		{"big int", `123456789012345678901234567890`, `123456789012345678901234567890`},
		{"negative big int with zero frac", `-123456789012345678901234567890.000`, `-123456789012345678901234567890`},
		{"big int in sci", `1.23456789012345678901234567890e29`, `123456789012345678901234567890`},
		{"many digits fraction", `3.14159265358979323846264338327950288`, `3.14159265358979323846264338327950288`},
		{"1e21 plain", `1e21`, `1000000000000000000000`},
		{"1e22 sci", `1e22`, `1e+22`},
		{"int with 21 zeros", `1000000000000000000000`, `1000000000000000000000`},
		{"int with 24 zeros", `1000000000000000000000000`, `1e+24`},
		{"int with 23 zeros", `12300000000000000000000000`, `1.23e+25`},
		{"0.000001", `0.000001`, `0.000001`},
		{"1e-20 plain", `1e-20`, `0.00000000000000000001`},
		{"1e-21 plain", `1e-21`, `0.000000000000000000001`},
		{"1e-22 sci", `1e-22`, `1e-22`},
		{"1.25e-22", `12.5e-23`, `1.25e-22`},
		{"12.5e-1", `12.5e-1`, `1.25`},
		{"-5e-1", `-5e-1`, `-0.5`},
		{"0.00123", `0.00123e0`, `0.00123`},
		{"exp leading zeros", `1e0000000000000000000000005`, `100000`},
		{"18-digit exponent", `1e999999999999999999`, `1e+999999999999999999`},
		{"18-digit negative exponent", `25e-999999999999999999`, `2.5e-999999999999999998`},
		{"-1.5E-0", `-1.5E-0`, `-1.5`},
		{"small int", `42`, `42`},
		{"negative int", `-7`, `-7`},
		{"int trailing zeros", `-1200`, `-1200`},
		{"numbers in array", `[1.0,2.50,-0,1e0,10E-1]`, `[1,2.5,0,1,1]`},

		// Literals.
		{"true", ` true `, `true`},
		{"false", `false`, `false`},
		{"null", `null`, `null`},
		{"literals in array", `[true,false,null]`, `[true,false,null]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Canonical([]byte(tc.in))
			if err != nil {
				t.Fatalf("Canonical(%q) error: %v", tc.in, err)
			}
			if string(got) != tc.want {
				t.Fatalf("Canonical(%q)\n got %q\nwant %q", tc.in, got, tc.want)
			}
			again, err := Canonical(got)
			if err != nil || !bytes.Equal(again, got) {
				t.Fatalf("not idempotent: Canonical(%q) = %q, %v", got, again, err)
			}
			if !json.Valid(got) {
				t.Fatalf("output %q is not valid JSON", got)
			}
		})
	}
}

func TestCanonicalEqualDigests(t *testing.T) {
	groups := [][]string{
		{`{"b":1,"a":1.0}`, `{ "a":1, "b":1 }`, `{"a":1e0,"b":100e-2}`, "{\n\t\"\\u0062\": 1,\n\t\"a\": 0.1e1\n}"},
		{`"é"`, `"\u00e9"`, `"\u00E9"`},
		{`"/"`, `"\/"`},
		{`0`, `-0`, `0.0`, `0e10`, `-0.000E-3`},
	}
	for _, g := range groups {
		want, err := Digest([]byte(g[0]))
		if err != nil {
			t.Fatalf("Digest(%q): %v", g[0], err)
		}
		for _, in := range g[1:] {
			got, err := Digest([]byte(in))
			if err != nil {
				t.Fatalf("Digest(%q): %v", in, err)
			}
			if got != want {
				t.Errorf("Digest(%q) = %s, want %s (same as %q)", in, got, want, g[0])
			}
		}
	}
	a, _ := Digest([]byte(`{"a":1}`))
	b, _ := Digest([]byte(`{"a":2}`))
	if a == b {
		t.Errorf("different values have equal digests")
	}
}

func TestDigestKnownVector(t *testing.T) {
	sum := sha256.Sum256([]byte(`{"a":1}`))
	want := hex.EncodeToString(sum[:])
	for _, in := range []string{`{"a":1}`, ` { "a" : 1.0 } `} {
		got, err := Digest([]byte(in))
		if err != nil {
			t.Fatalf("Digest(%q): %v", in, err)
		}
		if got != want {
			t.Errorf("Digest(%q) = %s, want %s", in, got, want)
		}
	}
	if want != "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862" {
		t.Errorf("unexpected sha256 of {\"a\":1}: %s", want)
	}
	d, err := Digest([]byte(`{`))
	if d != "" || !errors.Is(err, ErrInvalidJSON) {
		t.Errorf("Digest(invalid) = %q, %v; want \"\", ErrInvalidJSON", d, err)
	}
}

func TestCanonicalInvalid(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty", ``, "empty input at offset 0"},
		{"only whitespace", " \n\t", "empty input at offset 3"},
		{"leading zero", `01`, "leading zero at offset 0"},
		{"negative leading zero", `-01`, "leading zero at offset 0"},
		{"lone minus", `-`, "missing digits at offset 0"},
		{"minus then letter", `-a`, "missing digits"},
		{"trailing dot", `1.`, "missing digits after decimal point at offset 0"},
		{"leading dot", `.5`, "unexpected character '.'"},
		{"plus sign", `+1`, "unexpected character '+'"},
		{"missing exp digits", `1e`, "missing exponent digits"},
		{"missing exp digits after sign", `1e+`, "missing exponent digits"},
		{"dot then exp", `1.e5`, "missing digits after decimal point"},
		{"exponent too large", `1e1000000000000000000`, "exponent too large"},
		{"NaN", `NaN`, "unexpected character 'N'"},
		{"Infinity", `-Infinity`, "missing digits"},
		{"hex number", `0x10`, "unexpected data after top-level value at offset 1"},
		{"bad escape", `"\x"`, `invalid escape "\\x" in string at offset 1`},
		{"short u escape", `"\u12"`, `invalid \u escape in string at offset 1`},
		{"non-hex u escape", `"\u12g4"`, `invalid \u escape`},
		{"lone high surrogate", `"\ud800"`, "lone high surrogate"},
		{"high surrogate then char", `"\ud800\u0041"`, "lone high surrogate"},
		{"high surrogate then high", `"a\ud83d\ud83d"`, "lone high surrogate \\u escape in string at offset 2"},
		{"lone low surrogate", `"\udc00"`, "lone low surrogate"},
		{"reversed pair", `"\ude00\ud83d"`, "lone low surrogate"},
		{"unterminated string", `"abc`, "unterminated string at offset 0"},
		{"unterminated after escape", `"abc\`, "unterminated string"},
		{"unterminated escaped string", `"a\nbc`, "unterminated string"},
		{"raw control char", "\"a\x01\"", "control character in string at offset 2"},
		{"raw newline in string", "\"a\nb\"", "control character in string"},
		{"raw tab after escape", "\"\\n\t\"", "control character in string"},
		{"invalid utf8", "\"\xff\"", "invalid UTF-8 in string at offset 1"},
		{"invalid utf8 after escape", "\"\\n\xc3\"", "invalid UTF-8 in string"},
		{"truncated utf8", "\"\xe2\x82\"", "invalid UTF-8"},
		{"overlong utf8", "\"\xc0\xaf\"", "invalid UTF-8"},
		{"utf8 surrogate", "\"\xed\xa0\x80\"", "invalid UTF-8"},
		{"duplicate key", `{"a":1,"a":2}`, `duplicate key "a" at offset 7`},
		{"duplicate key via escape", `{"a":1,"\u0061":2}`, `duplicate key "a" at offset 7`},
		{"duplicate key reports first repeat", `{"b":1,"a":1,"c":1,"a":2,"b":2}`, `duplicate key "a" at offset 19`},
		{"nested duplicate key", `{"x":{"b":1,"b":2}}`, `duplicate key "b" at offset 12`},
		{"trailing comma object", `{"a":1,}`, "expected string object key"},
		{"trailing comma array", `[1,]`, "unexpected character ']', expected a value at offset 3"},
		{"missing comma", `[1 2]`, "expected ',' or ']' in array at offset 3"},
		{"missing colon", `{"a" 1}`, "expected ':' after object key at offset 5"},
		{"non-string key", `{1:2}`, "expected string object key at offset 1"},
		{"single-quoted", `{'a':1}`, "expected string object key"},
		{"unclosed object", `{"a":1`, "unexpected end of input in object"},
		{"unclosed array", `[1`, "unexpected end of input in array"},
		{"missing value", `{"a":}`, "expected a value"},
		{"eof after colon", `{"a":`, "unexpected end of input, expected a value"},
		{"eof after key", `{"a"`, "expected ':'"},
		{"eof after brace", `{`, "expected object key"},
		{"bad literal", `tru`, "invalid literal, expected true at offset 0"},
		{"bad literal null", `nul`, "expected null"},
		{"capital literal", `True`, "unexpected character 'T'"},
		{"two values", `true false`, "unexpected data after top-level value at offset 5"},
		{"two numbers", `1 2`, "unexpected data after top-level value at offset 2"},
		{"extra brace", `{}}`, "unexpected data after top-level value at offset 2"},
		{"number then letter", `[1x]`, "expected ',' or ']'"},
		{"too deep arrays", strings.Repeat("[", 1001) + strings.Repeat("]", 1001), "nesting deeper than 1000 levels at offset 1000"},
		{"too deep objects", strings.Repeat(`{"a":`, 1001) + "1" + strings.Repeat("}", 1001), "nesting deeper than 1000 levels"},
		{"too deep unclosed", strings.Repeat("[", 1_000_000), "nesting deeper than 1000 levels"},
		{"BOM", "\ufeff{}", "unexpected character"},
		{"comment", `{} // x`, "unexpected data after top-level value"},
		{"nul byte outside", "1\x00", "unexpected data after top-level value"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Canonical([]byte(tc.in))
			if err == nil {
				t.Fatalf("Canonical(%.60q) = %q, want error containing %q", tc.in, got, tc.want)
			}
			if got != nil {
				t.Errorf("Canonical returned non-nil output %q with error", got)
			}
			if !errors.Is(err, ErrInvalidJSON) {
				t.Errorf("error %v does not wrap ErrInvalidJSON", err)
			}
			if !strings.HasPrefix(err.Error(), "residual: invalid JSON: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Canonical(%.60q) error = %q, want it to contain %q", tc.in, err, tc.want)
			}
		})
	}
}

func TestCanonicalDepthLimit(t *testing.T) {
	for _, depth := range []int{1, 999, 1000} {
		in := strings.Repeat("[", depth) + strings.Repeat("]", depth)
		got, err := Canonical([]byte(in))
		if err != nil || string(got) != in {
			t.Fatalf("depth %d: got %.20q, %v", depth, got, err)
		}
	}
	in := strings.Repeat(`{"b":[0,`, 500) + "1" + strings.Repeat("]}", 500)
	if _, err := Canonical([]byte(in)); err != nil {
		t.Fatalf("depth 1000 mixed: %v", err)
	}
	in = `[` + in + `]`
	if _, err := Canonical([]byte(in)); err == nil || !strings.Contains(err.Error(), "nesting deeper than 1000 levels at offset 3998") {
		t.Fatalf("depth 1001 mixed: %v", err)
	}
}

func TestCanonicalDoesNotAliasInput(t *testing.T) {
	in := []byte(`"abc"`)
	out, err := Canonical(in)
	if err != nil {
		t.Fatal(err)
	}
	in[1] = 'X'
	if string(out) != `"abc"` {
		t.Fatalf("output aliases input: %q", out)
	}
}

func TestCompareUTF16(t *testing.T) {
	// Sorted in UTF-16 code unit order.
	keys := []string{"", "\x00", "\n", "1", "A", "a", "ab", "\u0080", "\u00f6", "\u07ff",
		"\u0800", "\u20ac", "\ud7ff", "\U00010000", "\U0001F600", "\U0001F600a", "\U0001F601",
		"\U0010FFFF", "\ue000", "\ufb33", "\uff61", "\uffff"}
	for i, a := range keys {
		for j, b := range keys {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := compareUTF16([]byte(a), []byte(b)); got != want {
				t.Errorf("compareUTF16(%q, %q) = %d, want %d", a, b, got, want)
			}
		}
	}
}

func TestCanonicalConcurrent(t *testing.T) {
	docs := []string{benchDoc, `{"b":{"d":1,"c":2},"a":[3,2,1]}`, `"\u00e9\n"`, `1.50e3`}
	done := make(chan struct{})
	for g := 0; g < 4; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; i < 200; i++ {
				d := docs[(g+i)%len(docs)]
				a, err := Canonical([]byte(d))
				if err != nil {
					t.Error(err)
					return
				}
				b, _ := Canonical(a)
				if !bytes.Equal(a, b) {
					t.Errorf("mismatch for %q", d)
					return
				}
			}
		}()
	}
	for g := 0; g < 4; g++ {
		<-done
	}
}

// hasNumber reports whether a value decoded by encoding/json contains a number.
func hasNumber(v any) bool {
	switch v := v.(type) {
	case float64, json.Number:
		return true
	case []any:
		for _, e := range v {
			if hasNumber(e) {
				return true
			}
		}
	case map[string]any:
		for _, e := range v {
			if hasNumber(e) {
				return true
			}
		}
	}
	return false
}

// Failures that Canonical may report for documents encoding/json.Valid
// accepts (stricter rules of the canonical form).
var stricterThanStdlib = []string{
	"duplicate key", "invalid UTF-8", "surrogate", "nesting deeper than", "exponent too large",
}

func FuzzCanonical(f *testing.F) {
	seeds := []string{
		`{"b":1,"a":1.0}`,
		`{ "a":1, "b":1 }`,
		`{"\uff61":1,"\ud83d\ude00":2,"\u20ac":3}`,
		`[1e2,0.10,-0,1E+2,100e-2,1.5e300,1e-300,123456789012345678901234567890]`,
		`"\u00e9\/\b\f\n\r\t\u0001\"\\"`,
		`{"a":{"b":[true,false,null,{}]},"c":[]}`,
		`{"a":1,"a":2}`,
		`"\ud800"`,
		`"\ud83d\ude00"`,
		"\"\xff\"",
		`01`,
		`1.`,
		`-`,
		`[[[[[[[[[[]]]]]]]]]]`,
		`1e22`,
		`0.000000000000000000001`,
		benchDoc,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Canonical(in)
		stdValid := json.Valid(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("error %v does not wrap ErrInvalidJSON", err)
			}
			if out != nil {
				t.Fatalf("non-nil output with error")
			}
			if stdValid {
				ok := false
				for _, s := range stricterThanStdlib {
					ok = ok || strings.Contains(err.Error(), s)
				}
				if !ok {
					t.Fatalf("Canonical rejected %q that encoding/json accepts: %v", in, err)
				}
			}
			return
		}
		if !stdValid {
			t.Fatalf("Canonical accepted %q that encoding/json rejects (output %q)", in, out)
		}
		if !json.Valid(out) {
			t.Fatalf("Canonical(%q) = %q is not valid JSON", in, out)
		}
		again, err := Canonical(out)
		if err != nil {
			t.Fatalf("Canonical(Canonical(%q)) error: %v", in, err)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %q -> %q -> %q", in, out, again)
		}

		var vIn, vOut any
		if json.Unmarshal(in, &vIn) != nil {
			return // e.g. a number out of float64 range
		}
		if err := json.Unmarshal(out, &vOut); err != nil {
			t.Fatalf("json.Unmarshal(%q) failed on canonical form of %q: %v", out, in, err)
		}
		if !reflect.DeepEqual(vIn, vOut) {
			t.Fatalf("value changed: %q (%#v) -> %q (%#v)", in, vIn, out, vOut)
		}
		if !hasNumber(vIn) {
			re, err := json.Marshal(vIn)
			if err != nil {
				t.Fatalf("json.Marshal: %v", err)
			}
			d1, err1 := Digest(in)
			d2, err2 := Digest(re)
			if err1 != nil || err2 != nil || d1 != d2 {
				t.Fatalf("re-serialisation %q of %q changed the digest (%v, %v)", re, in, err1, err2)
			}
		}
	})
}

// benchDoc is a realistic ~1 KiB tool-call arguments object.
const benchDoc = `{
  "tool": "filesystem.write_file",
  "request_id": "req_01HZX4K9T2M3N5P7Q8R9S0V1W2",
  "arguments": {
    "path": "/home/agent/workspace/project/src/components/Dashboard.tsx",
    "mode": "overwrite",
    "create_dirs": true,
    "encoding": "utf-8",
    "content": "import React from 'react';\nexport function Dashboard({ user }) {\n  return <div className=\"dash\">Hello, {user.name} \u00e9\u20ac</div>;\n}\n",
    "permissions": 420,
    "max_bytes": 1048576,
    "timeout_seconds": 30.0,
    "tags": ["frontend", "react", "generated", "review-required"],
    "backup": {"enabled": false, "suffix": ".bak", "keep": 3}
  },
  "context": {
    "session_id": "sess-7f3a9c2e-41d8-4b6a-9e0f-5c1b2a3d4e5f",
    "user": {"id": 10423, "role": "developer", "org": "acme-corp"},
    "model": "assistant-large-2025-06",
    "temperature": 0.20,
    "trace": {"span_id": "a1b2c3d4e5f60718", "parent_span_id": null, "sampled": true},
    "timestamp": "2025-06-14T09:31:27.184Z",
    "cost_estimate_usd": 1.25e-3
  },
  "policy_hints": ["no-network", "workspace-only", "audit"]
}`

func BenchmarkCanonical(b *testing.B) {
	doc := []byte(benchDoc)
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Canonical(doc); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCanonicalSorted(b *testing.B) {
	doc, err := Canonical([]byte(benchDoc))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Canonical(doc); err != nil {
			b.Fatal(err)
		}
	}
}
