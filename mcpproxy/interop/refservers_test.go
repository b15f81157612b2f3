package interop_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/residual"
)

// The reference servers of the MCP project, @modelcontextprotocol/server-filesystem and
// @modelcontextprotocol/server-memory (exact versions in tsHostDir's package.json and
// package-lock.json, installed with the TypeScript SDK by node), behind toolfence proxy with
// default settings, driven by the Go SDK host and the TypeScript SDK host: a session of
// normal work mixed with the mistakes a model typically makes leaves no key that needs a
// person, every answer reaches the host as the server gave it, and the work is done once.

// refHosts are the hosts the sessions run with.
var refHosts = []string{"go-sdk", "ts-sdk"}

// refServer returns the absolute path of the entry script of a reference server package
// (server-filesystem, server-memory); node must have installed tsHostDir.
func refServer(t *testing.T, pkg string) string {
	t.Helper()
	path, err := filepath.Abs(filepath.Join(tsHostDir, "node_modules", "@modelcontextprotocol", pkg, "dist", "index.js"))
	require.NoError(t, err)
	_, err = os.Stat(path)
	require.NoError(t, err, "%s is not installed in %s", pkg, tsHostDir)
	return path
}

// refArgv is the command a host runs: toolfence proxy (server id id, the world's flags) in
// front of server (a command).
func (w *world) refArgv(id string, server ...string) []string {
	argv := append([]string{bin, "proxy", "--store", w.store, "--server-id", id}, w.flags...)
	return append(append(argv, "--"), server...)
}

// refStep is one call of a scripted session.
type refStep struct {
	name string // what the call is: normal work or the mistake it makes
	tool string
	args map[string]any
	want refWant // refOK unless set
	text string  // a part of the answer's text (refServerError, refUnlisted)
	kept bool    // the call leaves a residual: a protected tool (not read-only) the server lists
}

// refRun makes steps' calls in order through argv with a host of kind ("go-sdk", "ts-sdk")
// and returns the host's answers; a JSON-RPC error is an outcome with RPCError.
func (w *world) refRun(nodeBin, kind string, argv []string, steps []refStep) []outcome {
	w.t.Helper()
	if kind == "ts-sdk" {
		var calls []tsCall
		for _, s := range steps {
			calls = append(calls, tsCall{Name: s.tool, Arguments: s.args})
		}
		spec := w.tsStdio(argv)
		spec["calls"], spec["errors"] = calls, true
		_, outs, _ := w.tsJobAsked(nodeBin, spec)
		return outs
	}
	h := w.goSDK(argv)
	var outs []outcome
	for _, s := range steps {
		o, err := h.callErr(w.t.Context(), s.tool, s.args, nil)
		var we *jsonrpc.Error
		if errors.As(err, &we) {
			o, err = outcome{RPCError: &rpcError{Code: we.Code, Message: we.Message}}, nil
		}
		require.NoError(w.t, err, "step %q", s.name)
		outs = append(outs, o)
	}
	require.NoError(w.t, h.close())
	return outs
}

// TestRefServerProxyKilledMidEdit: the proxy is SIGKILLed while server-filesystem works on
// an edit_file call (the file is a FIFO: the server's read of it blocks, and the test's open
// of it for writing returns only once the server opened it, so the call is in the server's
// hands, no sleep). A new proxy on the same store refuses the same call as an unknown outcome
// and sends nothing: the file, a regular file again, is unchanged.
func TestRefServerProxyKilledMidEdit(t *testing.T) {
	t.Parallel()
	nodeBin := node(t)
	w := setup(t, "", "")
	w.flags = []string{"--lease", "1s"}
	root := filepath.Join(w.dir, "root")
	require.NoError(t, os.Mkdir(root, 0o700))
	file := filepath.Join(root, "draft.txt")
	require.NoError(t, syscall.Mkfifo(file, 0o600))
	argv := w.refArgv("fs", nodeBin, refServer(t, "server-filesystem"), root)
	edit := map[string]any{"path": file, "edits": []any{map[string]any{"oldText": "draft", "newText": "final"}}}

	proxy := exec.Command(argv[0], argv[1:]...)
	h := w.goSDKCmd(proxy)
	done := make(chan error, 1)
	go func() {
		_, err := h.callErr(t.Context(), "edit_file", edit, nil)
		done <- err
	}()
	opened := make(chan *os.File, 1)
	go func() {
		f, err := os.OpenFile(file, os.O_WRONLY, 0) // returns once the server opened it to read
		if err != nil {
			f = nil
		}
		opened <- f
	}()
	var writer *os.File
	select {
	case writer = <-opened:
		require.NotNil(t, writer, "open the FIFO for writing")
	case <-time.After(30 * time.Second):
		t.Fatalf("server-filesystem never opened the file of edit_file; stderr:\n%s", w.stderr)
	}
	defer writer.Close()
	require.NoError(t, proxy.Process.Kill())
	require.Error(t, <-done, "the proxy died: the host gets no answer")
	_ = h.close()

	require.NoError(t, os.Remove(file))
	require.NoError(t, os.WriteFile(file, []byte("draft\n"), 0o600))
	h = w.goSDK(argv)
	o := untilCallRefused(t, h, "edit_file", edit, kindUnknown)
	require.Contains(t, o.text(), "outcome unknown")
	require.NoError(t, h.close())
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, "draft\n", string(b), "nothing was sent a second time")
	rs := w.residuals()
	require.Len(t, rs, 1)
	require.Equal(t, "fs/edit_file", rs[0].Operation)
	require.Equal(t, residual.Unknown, rs[0].State)
	require.Equal(t, 1, rs[0].AttemptCount)
}
