package mcpproxy_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpproxy"
)

// The warning that a protected tool has no target pointers is given once per tool per
// proxy, not once per session.
func TestProxyWarnsOfMissingTargetPointersOncePerTool(t *testing.T) {
	o := newOneProxy(t)
	for _, path := range []string{"/a", "/b"} { // new arguments: each call is dispatched
		host, up, _, _ := o.session(t)
		host.send(t, float64(1), "tools/call", `{"name":"write","arguments":{"path":"`+path+`"}}`)
		listOnce(t, up, writeDef)
		guarded := up.nextReq(t)
		require.Equal(t, "tools/call", guarded.Method)
		up.answer(t, guarded.ID, `{"content":[]}`)
		response(t, host, 1)
	}
	require.Equal(t, 1, strings.Count(o.logs.String(), "no target pointers"), o.logs.String())
}

// Sessions that end normally (the host's DELETE, the server's shutdown) log no WARN or
// ERROR line.
func TestHTTPSessionsEndingNormallyLogNoWarning(t *testing.T) {
	const tok = "tok-0123456789abcdef"
	logs := &lockedBuffer{}
	r := newLimitRig(t, mcpproxy.HTTPOptions{Logger: slog.New(slog.NewTextHandler(logs, nil))}, map[string]string{tok: "default"})
	id, _ := r.initialize(t, tok)
	req, err := http.NewRequest(http.MethodDelete, r.url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Mcp-Session-Id", id)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Less(t, resp.StatusCode, 300, "the DELETE ended the session")
	<-r.ended
	for range 16 {
		r.initialize(t, tok)
	}
	require.NoError(t, r.h.Close()) // as on SIGTERM
	for _, line := range strings.Split(logs.String(), "\n") {
		require.NotContains(t, line, "level=WARN", logs.String())
		require.NotContains(t, line, "level=ERROR", logs.String())
	}
}
