package mcpproxy

import (
	"errors"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolfence/toolfence/interceptor"
)

// FuzzParsePolicy: any document either parses into a policy whose every tool has a valid
// mode, or is refused with an error wrapping interceptor.ErrInvalidOptions; never a panic.
func FuzzParsePolicy(f *testing.F) {
	for _, seed := range []string{
		`{"tools": {"charge": {"mode": "protect", "target": ["/order_id"], "lease": "30s", "timeout": "2m"}}}`,
		`{"tools": {"charge": {"mode": "protect"}, "charge": {"mode": "bypass"}}}`,
		`{"tools": {"charge": {"Mode": "bypass"}}}`,
		`{"tools": {"c": {"probe": {"tool": "f", "found": "/x", "arguments": {"id": "/a", "id": "/b"}}}}}`,
		`{"tools": {"c": {"no_effect": {"codes": [-32000], "patterns": ["^card declined"]}, "key": {"argument": "k"}}}}`,
		`{"tools": [1, {"a": 2}], "x": {"y": [[]]}}`,
		"tools:\n  charge: {mode: protect, Mode: bypass}\n",
		"tools:\n  a:\n    probe: {tool: b, found: /f, arguments: {id: /id}}\n",
		"tools: {}\n---\ntools: {}\n",
		`{"tools": {"a": {"lease": {"a": 1}}}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		p, err := ParsePolicy(doc)
		if err != nil {
			if !errors.Is(err, interceptor.ErrInvalidOptions) {
				t.Fatalf("error does not wrap interceptor.ErrInvalidOptions: %v", err)
			}
			return
		}
		for name, tp := range p.Tools {
			if tp.Mode != "" && tp.Mode != Protect && tp.Mode != Bypass {
				t.Fatalf("tool %q: mode %q was accepted", name, tp.Mode)
			}
		}
	})
}

// FuzzDecodeLine: a line of the stdio framing decodes into messages or an error, never a
// panic; a tools/call among them parses into a call or a refusal.
func FuzzDecodeLine(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{"order_id":"A"}}}`,
		`{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"a","Name":"b"}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"a","arguments":{},"arguments":{"x":1}}}`,
		`[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":3,"result":{}}]`,
		`{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"x"}}`,
		`[]`, `{}`, `nul`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		msgs, err := decodeLine(line)
		if err != nil {
			return
		}
		for _, m := range msgs {
			if m == nil {
				t.Fatal("a nil message without an error")
			}
			if r, ok := m.(*jsonrpc.Request); ok && r.Method == "tools/call" {
				if c := parseCall(r); c.invalid == "" && (c.params.Name == "" || checkParamKeys(r.Params) != nil) {
					t.Fatalf("call accepted with params %s", r.Params)
				}
			}
		}
	})
}
