package policy_test

import (
	"errors"
	"testing"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpproxy/policy"
)

// FuzzParse: any document either parses into a policy whose every tool has a valid
// mode, or is refused with an error wrapping interceptor.ErrInvalidOptions; never a panic.
func FuzzParse(f *testing.F) {
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
		p, err := policy.Parse(doc)
		if err != nil {
			if !errors.Is(err, interceptor.ErrInvalidOptions) {
				t.Fatalf("error does not wrap interceptor.ErrInvalidOptions: %v", err)
			}
			return
		}
		for name, tp := range p.Tools {
			if tp.Mode != "" && tp.Mode != policy.Protect && tp.Mode != policy.Bypass {
				t.Fatalf("tool %q: mode %q was accepted", name, tp.Mode)
			}
		}
	})
}
