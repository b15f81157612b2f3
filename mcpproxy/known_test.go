package mcpproxy_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/residual"
)

// An error a known server raises before it acts (mcpproxy's knownServers) is no effect: the
// host gets upstream's answer untouched and the key is failed. Only when the upstream's
// initialize answer named that server, only for the tools the error is listed for, and only
// at the start of the first text block; anything else stays unknown.
func TestProxyKnownServerRefusals(t *testing.T) {
	const outside = "Access denied - path outside allowed directories: /etc/x not in /srv/root"
	for _, c := range []struct {
		name, server, tool, text string
		want                     residual.State
	}{
		{"server-filesystem, path outside the root", "secure-filesystem-server", "write_file", outside, residual.Failed},
		{"server-filesystem, stale edit", "secure-filesystem-server", "edit_file", "Could not find exact match for edit:\nv1", residual.Failed},
		{"server-filesystem, rename over a directory", "secure-filesystem-server", "write_file", "EISDIR: illegal operation on a directory, rename '/r/a.tmp' -> '/r/a'", residual.Failed},
		{"server-memory, unknown entity", "memory-server", "add_observations", "Entity with name carol not found", residual.Failed},
		{"the same words from another server", "my-files", "write_file", outside, residual.Unknown},
		{"no initialize answer seen", "", "write_file", outside, residual.Unknown},
		{"a tool the error is not listed for", "memory-server", "create_entities", "Entity with name carol not found", residual.Unknown},
		{"a failed write, which may have created the file", "secure-filesystem-server", "write_file", "ENOSPC: no space left on device, write", residual.Unknown},
		{"mkdir -p, which may have made some directories", "secure-filesystem-server", "create_directory", "ENOTDIR: not a directory, mkdir '/r/a/b'", residual.Unknown},
		{"the words after others", "secure-filesystem-server", "write_file", "wrote /r/x, then: " + outside, residual.Unknown},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, mcpproxy.Options{}, nil)
			if c.server != "" {
				r.host.send(t, "init", "initialize", `{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"h","version":"1"}}`)
				init := r.up.nextReq(t)
				require.Equal(t, "initialize", init.Method)
				r.up.answer(t, init.ID, `{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"`+c.server+`","version":"0.2.0"}}`)
				r.host.next(t)
			}
			r.host.send(t, float64(1), "tools/call", `{"name":"`+c.tool+`","arguments":{"path":"/r/x"}}`)
			r.listed(t, `{"name":"`+c.tool+`","inputSchema":{"type":"object"}}`)
			call := r.up.nextReq(t)
			require.Equal(t, "tools/call", call.Method)
			isErr, _ := json.Marshal(map[string]any{"isError": true, "content": []any{map[string]any{"type": "text", "text": c.text}}})
			r.up.answer(t, call.ID, string(isErr))
			got := r.hostResult(t, 1)
			rs := r.residuals(t)
			require.Len(t, rs, 1)
			require.Equal(t, c.want, rs[0].State, rs[0].Attempts[0].Error)
			if c.want == residual.Failed {
				require.JSONEq(t, string(isErr), got, "upstream's answer, as it gave it")
				require.Contains(t, rs[0].Attempts[0].Error, "in the words with which "+c.server+" refuses a call before it acts")
			} else {
				require.Contains(t, got, "toolfence cannot tell whether it acted")
			}
		})
	}
}
