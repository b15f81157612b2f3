package mcpserver_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// TestRefusesRequestsFromWebPages: served without tokens on loopback, the endpoint refuses
// what a web page can make the browser send without a CORS preflight: a POST that is not
// application/json (415, before mcp-go's own 400) and any request from a non-loopback Origin
// (403, even as application/json, which a DNS-rebinding page sends same-origin). A batch
// that would begin a call writes nothing. A loopback origin (a local UI) is served.
func TestRefusesRequestsFromWebPages(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *mcpserver.Options) { o.Tokens = mcpwire.Tokens{} })
	empty := snapshot(t, e.led, nsA)
	batch := `[` + initBody + `,{"jsonrpc":"2.0","method":"notifications/initialized"},` +
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"begin_call","arguments":{"task":"t","operation":"o","target":"x","args":{}}}}]`
	send := func(method, body, contentType, origin string) (int, string) {
		req, err := http.NewRequestWithContext(ctx(t), method, e.url, strings.NewReader(body))
		require.NoError(t, err)
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, body := range []string{initBody, batch} {
		status, msg := send(http.MethodPost, body, "text/plain;charset=UTF-8", "https://evil.example")
		require.Equal(t, http.StatusForbidden, status)
		require.Contains(t, msg, "not a loopback origin")
		status, msg = send(http.MethodPost, body, "text/plain;charset=UTF-8", "")
		require.Equal(t, http.StatusUnsupportedMediaType, status)
		require.Contains(t, msg, "application/json")
		status, _ = send(http.MethodPost, body, "", "")
		require.Equal(t, http.StatusUnsupportedMediaType, status)
		status, _ = send(http.MethodPost, body, "application/json", "http://rebound.example:8080")
		require.Equal(t, http.StatusForbidden, status)
		status, _ = send(http.MethodPost, body, "application/json", "null")
		require.Equal(t, http.StatusForbidden, status)
	}
	status, _ := send(http.MethodGet, "", "", "https://evil.example")
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, empty, snapshot(t, e.led, nsA), "nothing was written")

	status, msg := send(http.MethodPost, initBody, "application/json", "http://localhost:6274")
	require.Equal(t, http.StatusOK, status, msg)
	// The SDK clients send application/json and no Origin: served as before.
	c := e.dial("", legacy)
	r := ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}})
	require.Equal(t, residual.Key(nsA, "t", "o", "x"), r.Key)
}
