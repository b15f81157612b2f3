package mcpproxy

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// FuzzDecodeLine: a line of the stdio framing (read through transport.Stdio) decodes into
// messages or an error, never a panic; a tools/call among them parses into a call or a
// refusal.
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
		conn := transport.Stdio(bytes.NewReader(append(line, '\n')), io.Discard)
		for {
			m, err := conn.Read(context.Background())
			if err != nil {
				return
			}
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
