package transport_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// TestHTTPUpstreamRefusesBadURLAndHeaders: malformed URLs and headers are clear errors
// that never quote a header's value.
func TestHTTPUpstreamRefusesBadURLAndHeaders(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"ftp://host/mcp":        `scheme "ftp": want http or https`,
		"/mcp":                  `scheme "": want http or https`,
		"http:///mcp":           "no host",
		"http://host/mcp#frag":  "a fragment",
		"http://h%zz/":          "not a valid URL",
		"localhost:8080/mcp":    "want http or https",
		"https://[::1/mcp":      "not a valid URL",
		"http://user:pw@/x?k=v": "no host",
	} {
		_, err := transport.DialUpstream(context.Background(), raw, nil)
		require.ErrorContains(t, err, want, raw)
		require.NotContains(t, err.Error(), "pw", raw)
	}
	for _, tc := range []struct {
		flag, want string
	}{
		{"X-Api-Key", "header 1: want NAME=VALUE"},
		{"Bad Name=secret-value", `"Bad Name" is not a valid header name`},
		{"X-Key=secret-value\nInjected: 1", "header 1 (X-Key): the value holds characters"},
		{"mcp-session-id=secret-value", "Mcp-Session-Id is set by the proxy itself"},
		{"Content-Type=secret-value", "Content-Type is set by the proxy itself"},
	} {
		_, err := transport.ParseHeaders([]string{tc.flag})
		require.ErrorContains(t, err, tc.want, tc.flag)
		require.NotContains(t, err.Error(), "secret-value")
	}
	h, err := transport.ParseHeaders([]string{"Authorization=Bearer abc=def", "X-A=1", "x-a=2"})
	require.NoError(t, err)
	require.Equal(t, "Bearer abc=def", h.Get("Authorization"), "only the first '=' separates")
	require.Equal(t, []string{"1", "2"}, h.Values("X-A"))
}

// TestHTTPUpstreamNotThere: a request to an upstream that refuses connections gets a
// made-up CodeUpstreamHTTP answer saying it was not sent, naming the URL without its
// secrets; the connection stays usable.
func TestHTTPUpstreamNotThere(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := strings.Replace(srv.URL, "http://", "http://user:pw-secret@", 1) + "/mcp?key=q-secret"
	srv.Close() // nothing listens there now
	conn, err := transport.DialUpstream(context.Background(), url, nil)
	require.NoError(t, err)
	defer conn.Close()
	for i := 1; i <= 2; i++ {
		id, _ := jsonrpc.MakeID(float64(i))
		require.NoError(t, conn.Write(context.Background(), &jsonrpc.Request{ID: id, Method: "tools/list", Params: json.RawMessage(`{}`)}))
		msg, err := conn.Read(context.Background())
		require.NoError(t, err)
		resp, ok := msg.(*jsonrpc.Response)
		require.True(t, ok)
		require.Equal(t, id, resp.ID)
		var we *jsonrpc.Error
		require.ErrorAs(t, resp.Error, &we)
		require.EqualValues(t, transport.CodeUpstreamHTTP, we.Code)
		var data struct {
			Sent *bool  `json:"sent"`
			Mark string `json:"mark"`
		}
		require.NoError(t, json.Unmarshal(we.Data, &data))
		require.NotNil(t, data.Sent)
		require.False(t, *data.Sent)
		require.NotEmpty(t, data.Mark)
		require.Contains(t, we.Message, strings.TrimPrefix(srv.URL, "http://"))
		require.NotContains(t, we.Message, "secret")
	}
}

func TestParseHeadersRefusesIdempotencyKeys(t *testing.T) {
	for _, h := range []string{"Idempotency-Key=abc", "x-idempotency-key=abc"} {
		_, err := transport.ParseHeaders([]string{"Authorization=Bearer x", h})
		require.Error(t, err, h)
		require.Contains(t, err.Error(), "header 2")
		require.Contains(t, err.Error(), "Idempotency-Key")
		require.NotContains(t, err.Error(), "abc", "never the value")
	}
}

// TestCodeUpstreamHTTPIsToolfences: the made-up answer's code is in the implementation-
// defined server-error range JSON-RPC leaves (−32000…−32099) outside −32020…−32099, which
// MCP 2026-07-28 reserves for itself.
func TestCodeUpstreamHTTPIsToolfences(t *testing.T) {
	t.Parallel()
	require.GreaterOrEqual(t, transport.CodeUpstreamHTTP, -32019)
	require.LessOrEqual(t, transport.CodeUpstreamHTTP, -32000)
}
