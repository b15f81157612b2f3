package interop_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/residual"
)

// refWant is how the answer of a step must reach the host.
type refWant int

const (
	refOK          refWant = iota // the server's result, untouched
	refServerError                // the server's isError result, untouched: recorded failed
	refUnlisted                   // JSON-RPC error -32602 for a tool the server does not list
)

// checkSession checks each answer against its step and the store's residuals (the proxy
// must have exited) against the steps, and fails the test listing every problem, each
// naming its step: an answer not as the server gave it, a residual that needs a person
// (unknown, accepted), a residual in another state than the answer says, or one missing.
func (w *world) checkSession(serverID string, steps []refStep, outs []outcome) {
	w.t.Helper()
	require.Len(w.t, outs, len(steps))
	var problems []string
	defer func() {
		if len(problems) > 0 {
			w.t.Errorf("%d problems:\n%s", len(problems), strings.Join(problems, "\n"))
		}
	}()
	bad := func(s refStep, format string, a ...any) {
		problems = append(problems, fmt.Sprintf("%s (%s): ", s.name, s.tool)+fmt.Sprintf(format, a...))
	}
	for i, s := range steps {
		o := outs[i]
		switch {
		case s.want == refUnlisted:
			if o.RPCError == nil || o.RPCError.Code != jsonrpc.CodeInvalidParams || !strings.Contains(o.RPCError.Message, s.text) {
				bad(s, "want JSON-RPC error -32602 %q, got %s", s.text, brief(o))
			}
		case o.RPCError != nil:
			bad(s, "want a tool result, got JSON-RPC error %d %q", o.RPCError.Code, o.RPCError.Message)
		case s.want == refOK && (o.IsError || o.Replayed):
			bad(s, "want the server's result, got %s", brief(o))
		case s.want == refServerError && (!o.IsError || o.Kind != "" || len(o.Texts) != 1 || !strings.Contains(o.text(), s.text)):
			bad(s, "want the server's own isError answer (one text block holding %q, no toolfence details), got %s", s.text, brief(o))
		}
	}
	byKey := map[string][]refStep{} // a residual's operation and target → the steps that call it
	for _, s := range steps {
		b, err := json.Marshal(s.args)
		require.NoError(w.t, err)
		d, err := residual.Digest(b)
		require.NoError(w.t, err)
		k := serverID + "/" + s.tool + " args:" + d
		byKey[k] = append(byKey[k], s)
	}
	left := map[string]bool{}
	for _, r := range w.residuals() {
		same, ok := byKey[r.Operation+" "+r.Target]
		if !ok {
			same = []refStep{{name: "a call no step made", tool: r.Operation}}
		}
		for _, s := range same {
			left[s.name] = true
		}
		s := same[0]
		var last residual.Attempt
		if n := len(r.Attempts); n > 0 {
			last = r.Attempts[n-1]
		}
		want := residual.Succeeded
		if s.want == refServerError {
			want = residual.Failed
		}
		switch {
		case r.State == residual.Unknown || r.State == residual.Accepted || r.State == residual.Pending:
			bad(s, "left its key %s, which needs a person: %q", r.State, last.Error)
		case !s.kept:
			bad(s, "left a residual (%s), but the call is not guarded", r.State)
		case r.State != want:
			bad(s, "recorded %s, want %s (%q)", r.State, want, last.Error)
		case r.AttemptCount != len(same):
			bad(s, "%d attempts, want %d (one per call: each was sent)", r.AttemptCount, len(same))
		}
	}
	for _, s := range steps {
		if s.kept && !left[s.name] {
			bad(s, "left no residual")
		}
	}
}

// brief is an answer in a line: its JSON-RPC error, or its isError flag, _meta kind and texts.
func brief(o outcome) string {
	if o.RPCError != nil {
		return fmt.Sprintf("JSON-RPC error %d %q", o.RPCError.Code, o.RPCError.Message)
	}
	texts := make([]string, len(o.Texts))
	for i, t := range o.Texts {
		if len(t) > 120 {
			t = t[:120] + "…"
		}
		texts[i] = fmt.Sprintf("%q", t)
	}
	return fmt.Sprintf("isError=%v kind=%q texts=[%s]", o.IsError, o.Kind, strings.Join(texts, ", "))
}

// fsSession is a session against server-filesystem with allowed root root; outside is a
// directory beside it holding secret.txt.
func fsSession(root, outside string) []refStep {
	in := func(p ...string) string { return filepath.Join(append([]string{root}, p...)...) }
	edit := func(path, old, new string) map[string]any {
		return map[string]any{"path": path, "edits": []any{map[string]any{"oldText": old, "newText": new}}}
	}
	return []refStep{
		{name: "make a directory", tool: "create_directory", args: map[string]any{"path": in("docs")}, kept: true},
		{name: "write a file", tool: "write_file", args: map[string]any{"path": in("docs", "notes.txt"), "content": "alpha\nbeta\n"}, kept: true},
		{name: "mistake: a required argument missing", tool: "write_file", args: map[string]any{"path": in("docs", "empty.txt")},
			want: refServerError, text: "MCP error -32602: Input validation error", kept: true},
		{name: "edit a file", tool: "edit_file", args: edit(in("docs", "notes.txt"), "beta", "beta\ngamma"), kept: true},
		{name: "mistake: a path outside the allowed root", tool: "write_file", args: map[string]any{"path": filepath.Join(outside, "evil.txt"), "content": "x"},
			want: refServerError, text: "Access denied - path outside allowed directories", kept: true},
		{name: "mistake: a relative path escaping the root", tool: "write_file", args: map[string]any{"path": "../" + filepath.Base(outside) + "/evil2.txt", "content": "x"},
			want: refServerError, text: "Access denied - path outside allowed directories", kept: true},
		{name: "mistake: reading outside the root (read-only, relayed)", tool: "read_text_file", args: map[string]any{"path": filepath.Join(outside, "secret.txt")},
			want: refServerError, text: "Access denied - path outside allowed directories"},
		{name: "write a todo", tool: "write_file", args: map[string]any{"path": in("todo.txt"), "content": "v1: buy milk\n"}, kept: true},
		{name: "rewrite the todo", tool: "write_file", args: map[string]any{"path": in("todo.txt"), "content": "v2: buy oat milk\n"}, kept: true},
		{name: "mistake: an edit whose oldText is stale", tool: "edit_file", args: edit(in("todo.txt"), "v1: buy milk", "v3: buy cheese"),
			want: refServerError, text: "Could not find exact match for edit", kept: true},
		{name: "mistake: the same stale edit again", tool: "edit_file", args: edit(in("todo.txt"), "v1: buy milk", "v3: buy cheese"),
			want: refServerError, text: "Could not find exact match for edit", kept: true},
		{name: "mistake: an unknown tool", tool: "delete_file", args: map[string]any{"path": in("todo.txt")},
			want: refUnlisted, text: "Unknown tool: delete_file"},
		{name: "mistake: an argument of the wrong type", tool: "write_file", args: map[string]any{"path": in("docs", "n.txt"), "content": 42},
			want: refServerError, text: "MCP error -32602: Input validation error", kept: true},
		{name: "mistake: edits not an array", tool: "edit_file", args: map[string]any{"path": in("docs", "notes.txt"), "edits": "beta -> delta"},
			want: refServerError, text: "MCP error -32602: Input validation error", kept: true},
		{name: "mistake: a directory where a file is expected", tool: "write_file", args: map[string]any{"path": in("docs"), "content": "x"},
			want: refServerError, text: "EISDIR", kept: true},
		{name: "mistake: editing a file that does not exist", tool: "edit_file", args: edit(in("nope.txt"), "a", "b"),
			want: refServerError, text: "ENOENT", kept: true},
		{name: "mistake: a parent directory that does not exist", tool: "write_file", args: map[string]any{"path": in("nodir", "x.txt"), "content": "x"},
			want: refServerError, text: "ENOENT", kept: true},
		{name: "read a file", tool: "read_text_file", args: map[string]any{"path": in("docs", "notes.txt")}},
		// A user has a file written A, then B, then A again: the third write is a new intent
		// (another write came between), sent, and A is on disk at the end.
		{name: "write a.txt A", tool: "write_file", args: map[string]any{"path": in("a.txt"), "content": "A"}, kept: true},
		{name: "write a.txt B", tool: "write_file", args: map[string]any{"path": in("a.txt"), "content": "B"}, kept: true},
		{name: "write a.txt A again", tool: "write_file", args: map[string]any{"path": in("a.txt"), "content": "A"}, kept: true},
		{name: "move a file", tool: "move_file", args: map[string]any{"source": in("todo.txt"), "destination": in("done.txt")}, kept: true},
		{name: "mistake: moving onto an existing file", tool: "move_file", args: map[string]any{"source": in("docs", "notes.txt"), "destination": in("done.txt")},
			want: refServerError, text: "Destination already exists", kept: true},
		{name: "mistake: moving a file that does not exist", tool: "move_file", args: map[string]any{"source": in("todo.txt"), "destination": in("todo2.txt")},
			want: refServerError, text: "ENOENT", kept: true},
	}
}

// memSession is a session against server-memory.
func memSession() []refStep {
	entity := func(name, typ string, obs ...string) map[string]any {
		return map[string]any{"name": name, "entityType": typ, "observations": append([]string{}, obs...)}
	}
	rel := func(from, to, typ string) map[string]any {
		return map[string]any{"from": from, "to": to, "relationType": typ}
	}
	return []refStep{
		{name: "create entities", tool: "create_entities", args: map[string]any{"entities": []any{entity("alice", "person", "likes tea"), entity("bob", "person")}}, kept: true},
		{name: "relate them", tool: "create_relations", args: map[string]any{"relations": []any{rel("alice", "bob", "knows")}}, kept: true},
		{name: "mistake: a relation to an entity that does not exist (the server records it)", tool: "create_relations",
			args: map[string]any{"relations": []any{rel("alice", "carol", "knows")}}, kept: true},
		{name: "mistake: observations for an entity that does not exist", tool: "add_observations",
			args: map[string]any{"observations": []any{map[string]any{"entityName": "carol", "contents": []string{"plays chess"}}}},
			want: refServerError, text: "Entity with name carol not found", kept: true},
		{name: "mistake: observation contents not an array", tool: "add_observations",
			args: map[string]any{"observations": []any{map[string]any{"entityName": "alice", "contents": "tall"}}},
			want: refServerError, text: "MCP error -32602: Input validation error", kept: true},
		{name: "mistake: observations without contents", tool: "add_observations",
			args: map[string]any{"observations": []any{map[string]any{"entityName": "alice"}}},
			want: refServerError, text: "MCP error -32602: Input validation error", kept: true},
		{name: "add an observation", tool: "add_observations",
			args: map[string]any{"observations": []any{map[string]any{"entityName": "alice", "contents": []string{"reads books"}}}}, kept: true},
		{name: "mistake: an unknown tool", tool: "create_entity", args: map[string]any{"name": "dave"},
			want: refUnlisted, text: "Unknown tool: create_entity"},
		{name: "mistake: an entity without its type", tool: "create_entities", args: map[string]any{"entities": []any{map[string]any{"name": "dave"}}},
			want: refServerError, text: "MCP error -32602: Input validation error", kept: true},
		{name: "mistake: deleting entities that do not exist (the server says done)", tool: "delete_entities",
			args: map[string]any{"entityNames": []string{"nobody"}}, kept: true},
		{name: "mistake: entity names not an array", tool: "delete_entities", args: map[string]any{"entityNames": "bob"},
			want: refServerError, text: "MCP error -32602: Input validation error", kept: true},
		{name: "read the graph", tool: "read_graph", args: map[string]any{}},
	}
}

// TestRefServersSessionWithMistakes: a session of normal work mixed with typical mistakes
// against each reference server, through the proxy with default settings, by the Go SDK
// host and the TypeScript SDK host. The mistakes' answers reach the host as the server gave
// them and are recorded failed (no key needs a person); the work is done exactly once
// (checked on disk and in the memory file), and a file written A, B, then A again holds A.
func TestRefServersSessionWithMistakes(t *testing.T) {
	t.Parallel()
	nodeBin := node(t)
	fsServer, memServer := refServer(t, "server-filesystem"), refServer(t, "server-memory")
	env, err := exec.LookPath("env")
	require.NoError(t, err)
	for _, kind := range refHosts {
		t.Run("server-filesystem/host="+kind, func(t *testing.T) {
			t.Parallel()
			w := setup(t, "", "")
			root, outside := filepath.Join(w.dir, "root"), filepath.Join(w.dir, "outside")
			require.NoError(t, os.Mkdir(root, 0o700))
			require.NoError(t, os.Mkdir(outside, 0o700))
			require.NoError(t, os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("secret\n"), 0o600))
			steps := fsSession(root, outside)
			outs := w.refRun(nodeBin, kind, w.refArgv("fs", nodeBin, fsServer, root), steps)
			w.checkSession("fs", steps, outs)
			requireTree(t, root, map[string]string{
				"a.txt":          "A",
				"docs/":          "",
				"docs/notes.txt": "alpha\nbeta\ngamma\n",
				"done.txt":       "v2: buy oat milk\n",
			})
			requireTree(t, outside, map[string]string{"secret.txt": "secret\n"})
		})
		t.Run("server-memory/host="+kind, func(t *testing.T) {
			t.Parallel()
			w := setup(t, "", "")
			memory := filepath.Join(w.dir, "memory.jsonl")
			steps := memSession()
			outs := w.refRun(nodeBin, kind, w.refArgv("mem", env, "MEMORY_FILE_PATH="+memory, nodeBin, memServer), steps)
			w.checkSession("mem", steps, outs)
			require.Equal(t, []string{
				`{"type":"entity","name":"alice","entityType":"person","observations":["likes tea","reads books"]}`,
				`{"type":"entity","name":"bob","entityType":"person","observations":[]}`,
				`{"type":"relation","from":"alice","to":"bob","relationType":"knows"}`,
				`{"type":"relation","from":"alice","to":"carol","relationType":"knows"}`,
			}, w.lines(memory))
		})
	}
}

// requireTree checks that dir holds exactly want: file paths (slash-separated, relative)
// with their contents, and directories with a trailing slash.
func requireTree(t *testing.T, dir string, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			got[filepath.ToSlash(rel)+"/"] = ""
			return nil
		}
		b, err := os.ReadFile(path)
		got[filepath.ToSlash(rel)] = string(b)
		return err
	}))
	require.Equal(t, want, got)
}
