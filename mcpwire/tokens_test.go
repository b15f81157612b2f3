package mcpwire_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpwire"
)

func TestCheckBind(t *testing.T) {
	t.Parallel()
	for addr, safe := range map[string]bool{
		"127.0.0.1:7777": true, "localhost:7777": true, "[::1]:7777": true, "127.9.9.9:1": true,
		"0.0.0.0:7777": false, ":7777": false, "[::]:7777": false, "10.0.0.1:7777": false, "example.com:7777": false,
	} {
		err := mcpwire.CheckBind(addr, 0)
		if safe {
			require.NoError(t, err, addr)
		} else {
			require.ErrorIs(t, err, mcpwire.ErrUnsafeBind, addr)
		}
		require.NoError(t, mcpwire.CheckBind(addr, 1), "%s with a token", addr)
	}
	require.Error(t, mcpwire.CheckBind("no-port", 0))
}

func TestParseTokens(t *testing.T) {
	t.Parallel()
	const a, b = "aaaaaaaaaaaaaaaa1", "bbbbbbbbbbbbbbbb2"
	for name, data := range map[string]string{
		"lines": "# tokens\n\n" + a + "\n" + b + " team-b\n",
		"json":  `{"` + a + `": "default", "` + b + `": "team-b"}`,
		"list":  `[{"token": "` + a + `", "namespace": "default"}, {"token": "` + b + `", "namespace": "team-b"}]`,
	} {
		tk, err := mcpwire.ParseTokens([]byte(data), "default")
		require.NoError(t, err, name)
		require.Equal(t, 2, tk.Len(), name)
		ns, ok := tk.Namespace(a)
		require.True(t, ok, name)
		require.Equal(t, "default", ns, name)
		ns, ok = tk.Namespace(b)
		require.True(t, ok, name)
		require.Equal(t, "team-b", ns, name)
		_, ok = tk.Namespace("cccccccccccccccc3")
		require.False(t, ok, name)
		_, ok = tk.Namespace("")
		require.False(t, ok, name)
	}
	for name, data := range map[string]string{
		"empty":        "# nothing\n",
		"short":        "short ns\n",
		"three fields": a + " ns extra\n",
		"empty ns":     `{"` + a + `": ""}`,
		"conflict":     a + " x\n" + a + " y\n",
		"repeated":     a + " x\n" + a + " x\n",
		"json dup":     `{"` + a + `": "x", "` + a + `": "y"}`,
		"json dup ns":  `{"` + a + `": "x", "` + a + `": "x"}`,
		"list dup":     `[{"token": "` + a + `", "namespace": "x"}, {"token": "` + a + `", "namespace": "x"}]`,
		"bad json":     `{"` + a + `": 1}`,
	} {
		_, err := mcpwire.ParseTokens([]byte(data), "default")
		require.ErrorIs(t, err, interceptor.ErrInvalidOptions, name)
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(path, []byte(a+"\n"), 0o644))
	_, err := mcpwire.LoadTokens(path, "default")
	require.ErrorIs(t, err, interceptor.ErrInvalidOptions, "a world-readable token file is refused")
	require.Contains(t, err.Error(), "chmod 600")
	require.NoError(t, os.Chmod(path, 0o600))
	tk, err := mcpwire.LoadTokens(path, "default")
	require.NoError(t, err)
	require.Equal(t, 1, tk.Len())
	_, err = mcpwire.LoadTokens(filepath.Join(dir, "missing"), "default")
	require.True(t, errors.Is(err, os.ErrNotExist))
}
