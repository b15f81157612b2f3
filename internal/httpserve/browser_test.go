package httpserve_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/httpserve"
)

func TestLoopbackOrigin(t *testing.T) {
	for _, o := range []string{"http://localhost", "http://localhost:6274", "https://LOCALHOST:1", "http://127.0.0.1:8080",
		"http://127.1.2.3", "http://[::1]:9", "https://[::1]"} {
		require.True(t, httpserve.LoopbackOrigin(o), o)
	}
	for _, o := range []string{"null", "https://evil.example", "http://localhost.evil.example", "http://127.0.0.1.nip.io",
		"file://", "ftp://localhost", "http://10.0.0.1", "http://[::2]", "http://user@localhost", "localhost", ""} {
		require.False(t, httpserve.LoopbackOrigin(o), o)
	}
}

func TestLoopbackHost(t *testing.T) {
	for _, h := range []string{"localhost", "LocalHost", "127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"} {
		require.True(t, httpserve.LoopbackHost(h), h)
	}
	for _, h := range []string{"", "example.com", "localhost.example.com", "10.0.0.1", "::2", "fe80::1%lo", "[::1]"} {
		require.False(t, httpserve.LoopbackHost(h), h)
	}
}

func TestCheckBrowser(t *testing.T) {
	req := func(method, ct, origin string) *http.Request {
		r := httptest.NewRequest(method, "/x", strings.NewReader("{}"))
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		return r
	}
	for _, r := range []*http.Request{
		req(http.MethodPost, "application/json", ""),
		req(http.MethodPost, "application/json; charset=utf-8", "http://localhost:3000"),
		req(http.MethodGet, "", ""),
		req(http.MethodDelete, "", "http://127.0.0.1:1"),
	} {
		status, err := httpserve.CheckBrowser(r)
		require.NoError(t, err)
		require.Zero(t, status)
	}
	status, err := httpserve.CheckBrowser(req(http.MethodPost, "text/plain;charset=UTF-8", ""))
	require.Equal(t, http.StatusUnsupportedMediaType, status)
	require.ErrorContains(t, err, "send Content-Type: application/json")
	status, err = httpserve.CheckBrowser(req(http.MethodPost, "", ""))
	require.Equal(t, http.StatusUnsupportedMediaType, status)
	require.Error(t, err)
	status, err = httpserve.CheckBrowser(req(http.MethodPost, "application/json", "https://evil.example"))
	require.Equal(t, http.StatusForbidden, status)
	require.ErrorContains(t, err, "evil.example")
	status, _ = httpserve.CheckBrowser(req(http.MethodGet, "", "null"))
	require.Equal(t, http.StatusForbidden, status)
}
