package main

import (
	"debug/buildinfo"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// tfIn runs the binary in directory dir with stdin as its standard input.
func tfIn(t *testing.T, dir string, stdin string, args ...string) result {
	t.Helper()
	return runIn(t, dir, stdin, nil, args...)
}

// names lists the entries of dir.
func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestReadingCommandsNeverCreateAStore: ls, show, resolve and gc on an empty directory say
// there is no store there and write nothing into it.
func TestReadingCommandsNeverCreateAStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key := residual.Key("default", "t", "o", "x")
	for _, args := range [][]string{
		{"ls"}, {"show", key}, {"resolve", key, "--as", "failed", "--note", "x"}, {"gc"}, {"gc", "--dry-run"},
	} {
		fails(t, 1, []string{"no store at " + dir + ": the directory is empty"}, append(args, "--store", dir)...)
		require.Empty(t, names(t, dir), "toolfence %v wrote into the directory", args)
	}
}

// TestANonStoreDirectoryIsRefused: a source folder given as --store is refused by every
// command, and nothing is written into it.
func TestANonStoreDirectoryIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n"), 0o644))
	key := residual.Key("default", "t", "o", "x")
	want := dir + " is a directory with other files in it, not a toolfence store"
	for _, args := range [][]string{
		{"ls"}, {"show", key}, {"resolve", key, "--as", "failed", "--note", "x"}, {"gc"}, {"demo"},
	} {
		fails(t, 1, []string{want}, append(args, "--store", dir)...)
		require.Equal(t, []string{"main.go"}, names(t, dir), "toolfence %v wrote into the directory", args)
	}
	r := tfIn(t, t.TempDir(), "", "serve", "--stdio", "--store", dir)
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, want)
	require.Equal(t, []string{"main.go"}, names(t, dir))

	file := filepath.Join(dir, "main.go")
	fails(t, 1, []string{"--store " + file + " is a file, not a store"}, "ls", "--store", file)
}

// TestAMistypedDSNIsRefused: a --store value that looks like a URL but is neither a
// postgres:// DSN nor an http(s):// server is bad usage, and no directory named after it appears.
func TestAMistypedDSNIsRefused(t *testing.T) {
	t.Parallel()
	cwd := t.TempDir()
	for _, args := range [][]string{
		{"serve", "--stdio"}, {"ls"}, {"gc"}, {"demo"},
	} {
		for _, store := range []string{"postgres:/postgres@127.0.0.1/db", "postgresql:postgres@db", "http:/127.0.0.1:7777", "ftp://host/x"} {
			r := tfIn(t, cwd, "", append(args, "--store", store)...)
			require.Equal(t, 2, r.code, "%v %s\n%s", args, store, r)
			require.Contains(t, r.stderr, "looks like a URL but is not a PostgreSQL DSN: write postgres://USER@HOST/DB")
			require.Empty(t, names(t, cwd), "toolfence %v --store %s created something", args, store)
		}
	}
	r := tfIn(t, cwd, "", "ls", "--store", "postgres:/u:secret@db/x")
	require.NotContains(t, r.stderr, "secret", "a password never shows")
}

// TestVersion: --version and the MCP server's reported version come from the build
// information of the binary.
func TestVersion(t *testing.T) {
	t.Parallel()
	bi, err := buildinfo.ReadFile(bin)
	require.NoError(t, err)
	want := versionOf(bi)
	require.Equal(t, "toolfence "+want+"\n", ok(t, "--version").stdout)

	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}` + "\n"
	r := tfIn(t, t.TempDir(), init, "serve", "--stdio", "--store", filepath.Join(t.TempDir(), "store"))
	require.Equal(t, 0, r.code, "%s", r)
	var resp struct {
		Result struct {
			ServerInfo struct{ Name, Version string } `json:"serverInfo"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.SplitN(r.stdout, "\n", 2)[0]), &resp), "%s", r)
	require.Equal(t, "toolfence", resp.Result.ServerInfo.Name)
	require.Equal(t, want, resp.Result.ServerInfo.Version)
}

func TestVersionOf(t *testing.T) {
	t.Parallel()
	set := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"go install @version", debug.BuildInfo{Main: debug.Module{Version: "v0.3.1"}}, "v0.3.1"},
		{"pseudo-version", debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261201215104-1a762aaa181c+dirty"}}, "v0.0.0-20261201215104-1a762aaa181c+dirty"},
		{"revision", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: set("vcs.revision", "1a762aaa181ccd3800b26ef814fa5a382aed18bb", "vcs.modified", "false")}, "devel-1a762aaa181c"},
		{"dirty revision", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: set("vcs.revision", "1a762aaa181ccd3800b26ef814fa5a382aed18bb", "vcs.modified", "true")}, "devel-1a762aaa181c+dirty"},
		{"nothing", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
	} {
		require.Equal(t, tc.want, versionOf(&tc.bi), tc.name)
	}
}

// commandTree returns every command of the binary.
func commandTree() []*cobra.Command {
	root := newRoot(&app{stdout: io.Discard, stderr: io.Discard})
	var all []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		all = append(all, c)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return all
}

// TestFlagHelpIsNotGarbled: pflag takes a `quoted` word of a flag's usage as the name of its
// value, so no flag's usage may hold a backtick; ls, show and resolve print --server with a
// plain "string" placeholder.
func TestFlagHelpIsNotGarbled(t *testing.T) {
	t.Parallel()
	for _, c := range commandTree() {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			require.NotContains(t, f.Usage, "`", "%s --%s", c.CommandPath(), f.Name)
		})
	}
	for _, name := range []string{"ls", "show", "resolve"} {
		r := ok(t, name, "--help")
		require.Regexp(t, `(?m)^\s+--server string\s+act through a running toolfence serve --http at this URL`, r.stdout, name)
	}
}

// TestJSONOutputPrintsResultsAsJSON: ls --json and show --json print a JSON result as JSON
// and any other result as a JSON string, never base64.
func TestJSONOutputPrintsResultsAsJSON(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var jsonKey, textKey string
	f.with(lease.Real{}, func(l ledger.Ledger) {
		jsonKey = f.settle(l, "default", "run-1", "charge", "invoice:1", residual.Succeeded)
		textKey, _ = f.reserve(l, "default", "run-1", "email", "email:bob", time.Minute)
		_, err := l.Commit(t.Context(), ledger.CommitParams{Namespace: "default", Key: textKey, Holder: "agent-1", Token: 1,
			Outcome: residual.Succeeded, Result: []byte("sent ok"), ResultDigest: "r2"})
		require.NoError(t, err)
	})
	out := ok(t, "ls", "--store", f.dir, "--json").stdout
	require.Contains(t, out, `"result":{"ok":true}`)
	require.Contains(t, out, `"result":"sent ok"`)
	require.NotContains(t, out, "eyJvayI6dHJ1ZX0=", "not base64")
	var shown map[string]any
	require.NoError(t, json.Unmarshal([]byte(ok(t, "show", jsonKey, "--store", f.dir, "--json").stdout), &shown))
	require.Equal(t, map[string]any{"ok": true}, shown["result"])
	require.NoError(t, json.Unmarshal([]byte(ok(t, "show", textKey, "--store", f.dir, "--json").stdout), &shown))
	require.Equal(t, "sent ok", shown["result"])
}

// twoKeysSharing returns two targets whose keys (namespace default, task run-1, operation
// charge) share their first four hex digits.
func twoKeysSharing(t *testing.T) (string, string) {
	t.Helper()
	seen := map[string]string{}
	for i := 0; ; i++ {
		target := "invoice:" + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + strconv.Itoa(i)
		p := residual.Key("default", "run-1", "charge", target)[:8]
		if other, ok := seen[p]; ok {
			return other, target
		}
		seen[p] = target
	}
}

// TestKeyPrefixes: show and resolve take a unique prefix of a key, as git takes commit
// hashes; an ambiguous prefix is refused with the keys it matches.
func TestKeyPrefixes(t *testing.T) {
	t.Parallel()
	a, b := twoKeysSharing(t)
	f := newFixture(t)
	var ka, kb, unknown string
	f.with(lease.Real{}, func(l ledger.Ledger) {
		ka = f.settle(l, "default", "run-1", "charge", a, residual.Succeeded)
		kb = f.settle(l, "default", "run-1", "charge", b, residual.Succeeded)
	})
	f.with(past(2*time.Hour), func(l ledger.Ledger) {
		unknown, _ = f.reserve(l, "default", "run-2", "email", "email:bob", time.Minute)
	})
	store := f.dir
	require.Equal(t, ka[:8], kb[:8])

	// The prefix ls prints, and shorter ones, with and without tf1_.
	short := regexp.MustCompile(`(?m)^(tf1_[0-9a-f]{8,})\s+unknown`).FindStringSubmatch(ok(t, "ls", "--store", store).stdout)
	require.NotNil(t, short)
	require.True(t, strings.HasPrefix(unknown, short[1]))
	for _, prefix := range []string{short[1], unknown[:8], unknown[4:12]} {
		require.Contains(t, ok(t, "show", prefix, "--store", store).stdout, "key             "+unknown, prefix)
	}
	// Ambiguous: both keys listed; more digits pick one.
	r := fails(t, 2, []string{"key prefix " + ka[:8] + " is ambiguous: 2 residuals in namespace default", ka, kb, "give more digits"},
		"show", ka[:8], "--store", store)
	require.NotContains(t, r.stderr, unknown)
	n := 8
	for ka[:n] == kb[:n] {
		n++
	}
	require.Contains(t, ok(t, "show", ka[:n], "--store", store).stdout, "key             "+ka)
	fails(t, 1, []string{"no residual whose key starts with tf1_0000ffff in namespace default"}, "show", "tf1_0000ffff", "--store", store)
	fails(t, 2, []string{`invalid key "tf1_abc"`, "a unique prefix of at least 4 hex digits"}, "show", "tf1_abc", "--store", store)

	// resolve takes a prefix too, and reports the whole key.
	r = ok(t, "resolve", unknown[:10], "--as", "failed", "--note", "not in the log", "--store", store)
	require.Regexp(t, `^resolved `+unknown+`: unknown → failed by \S+ \(fencing token 2\)\n$`, r.stdout)
}

// TestGCAgeUnits: the help says m is minutes and how to write months; units that could
// mean months or years are refused with that advice.
func TestGCAgeUnits(t *testing.T) {
	t.Parallel()
	require.Contains(t, ok(t, "gc", "--help").stdout, "m is minutes: 1m is one minute, not a month")
	dir := t.TempDir()
	for _, v := range []string{"1mo", "1M", "1y", "2w"} {
		fails(t, 2, []string{`invalid argument "` + v + `" for "--older-than"`, "months, weeks and years have no unit: write them in days (30d, 7d, 365d)"},
			"gc", "--older-than", v, "--store", dir)
	}
}

// TestLsFitsAHundredColumns: long tasks, targets and holders are cut so every line of the
// table fits 100 columns, a long tool name taking width from the task and target; --wide
// prints them whole.
func TestLsFitsAHundredColumns(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	long := strings.Repeat("very-long-", 20)
	var key string
	f.with(lease.Real{}, func(l ledger.Ledger) {
		key = residual.Key("default", long+"task", "send_a_very_long_operation_name", long+"target")
		_, err := l.Reserve(t.Context(), ledger.ReserveParams{Namespace: "default", Key: key, Task: long + "task",
			Operation: "send_a_very_long_operation_name", Target: long + "target", Holder: long + "holder", RequestDigest: "d", TTL: time.Hour})
		require.NoError(t, err)
		f.settle(l, "default", "run-1", "charge", "invoice:1", residual.Succeeded)
	})
	r := ok(t, "ls", "--store", f.dir)
	require.Len(t, tableRows(r.stdout), 2)
	for _, line := range strings.Split(strings.TrimRight(r.stdout, "\n"), "\n") {
		require.LessOrEqual(t, utf8.RuneCountInString(line), 100, "%q", line)
	}
	require.Contains(t, r.stdout, "send_a_very_long_operation_name", "a tool name is never cut")
	require.Contains(t, r.stdout, "very-…", "the task gives the operation its width")
	require.Contains(t, r.stdout, key[:12])
	require.NotContains(t, r.stdout, key)

	r = ok(t, "ls", "--store", f.dir, "--wide")
	require.Contains(t, r.stdout, key)
	require.Contains(t, r.stdout, long+"holder")
	require.Contains(t, r.stdout, long+"target")
}

// TestLsShowsProxyToolNamesWhole: a proxy's SERVER/TOOL operation too long for its column
// loses the server id, not the end of the tool name, and the table still fits 100 columns.
func TestLsShowsProxyToolNamesWhole(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.with(past(2*time.Hour), func(l ledger.Ledger) {
		f.reserve(l, "default", "run-1", "fs/write_file", "/tmp/a", time.Minute)
		f.reserve(l, "default", "run-2", "fs/move", "/tmp/b", time.Minute)
		f.reserve(l, "default", "run-3", "mail/send_message_with_attachments", "bob@example.com", time.Minute)
	})
	r := ok(t, "ls", "--store", f.dir)
	require.Len(t, tableRows(r.stdout), 3)
	require.NotContains(t, r.stdout, "fs/write_fi…")
	require.Contains(t, r.stdout, " …/write_file ")
	require.Contains(t, r.stdout, " fs/move ", "an operation that fits keeps its server id")
	require.Contains(t, r.stdout, " …/send_message_with_attachments ")
	for _, line := range strings.Split(strings.TrimRight(r.stdout, "\n"), "\n") {
		require.LessOrEqual(t, utf8.RuneCountInString(line), 100, "%q", line)
	}
	require.Contains(t, ok(t, "ls", "--store", f.dir, "--wide").stdout, " fs/write_file ")
}

// TestResolveTextResult: a --result that is not JSON is refused with the quoting that
// records it as text, and that quoting works.
func TestResolveTextResult(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var key string
	f.with(past(2*time.Hour), func(l ledger.Ledger) {
		key, _ = f.reserve(l, "default", "run-1", "email", "email:bob", time.Minute)
	})
	fails(t, 2, []string{`--result "sent ok" is not JSON`, `to record text, quote it as a JSON string: --result '"sent ok"'`},
		"resolve", key, "--as", "succeeded", "--note", "seen", "--result", "sent ok", "--store", f.dir)
	ok(t, "resolve", key, "--as", "succeeded", "--note", "seen", "--result", `"sent ok"`, "--store", f.dir)
	var got record
	require.NoError(t, json.Unmarshal([]byte(ok(t, "show", key, "--store", f.dir, "--json").stdout), &got))
	require.JSONEq(t, `"sent ok"`, string(got.Result))
}

// TestHelpNamesWhatNewcomersTripOn: serve's help gives the token minimum; eval's help does
// not list --store and --namespace, which eval refuses.
func TestHelpNamesWhatNewcomersTripOn(t *testing.T) {
	t.Parallel()
	require.Contains(t, ok(t, "serve", "--help").stdout, "A token is at least 16 bytes long")
	r := ok(t, "eval", "--help")
	require.NotContains(t, r.stdout, "Global Flags")
	require.NotContains(t, r.stdout, "--store string")
	require.NotContains(t, r.stdout, "--namespace string")
	require.Contains(t, r.stdout, "--trials")
	fails(t, 2, []string{"--store does not apply to eval"}, "eval", "--store", t.TempDir())
	require.Contains(t, ok(t, "ls", "--help").stdout, "--store", "other commands keep the global flags")
}

// TestTerminalInjection: text agents supplied (task, target, holder, notes, evidence) is
// printed by ls and show with its control characters escaped, so it can neither set the
// terminal's title nor forge lines; --json keeps it exact. Holders and resolvers with
// control characters never reach the store (every ledger refuses them); a bidi override
// in them is escaped.
func TestTerminalInjection(t *testing.T) {
	t.Parallel()
	const (
		title  = "\x1b]0;pwned\x07"
		forged = "\nnext: nothing to do, all settled"
		clear  = "\x1b[2J\u202e"
	)
	f := newFixture(t)
	task, target, holder := "run"+title, "invoice:1"+forged, "agent\u202e"
	key := residual.Key("default", task, "charge", target)
	f.with(past(2*time.Hour), func(l ledger.Ledger) {
		p := ledger.ReserveParams{Namespace: "default", Key: key, Task: task, Operation: "charge",
			Target: target, Holder: "agent" + clear + forged, RequestDigest: "d", TTL: time.Minute}
		_, err := l.Reserve(t.Context(), p)
		require.ErrorIs(t, err, ledger.ErrInvalidParams, "a holder with control characters is refused")
		p.Holder = holder
		_, err = l.Reserve(t.Context(), p)
		require.NoError(t, err)
		_, err = l.AppendEvidence(t.Context(), ledger.EvidenceParams{Namespace: "default", Key: key, Evidence: residual.Evidence{
			At: time.Now(), Holder: holder, Token: 1, Outcome: residual.Succeeded, Note: "late" + forged + title, Result: []byte("ok" + clear)}})
		require.NoError(t, err)
	})
	f.with(lease.Real{}, func(l ledger.Ledger) {
		_, err := l.Resolve(t.Context(), ledger.ResolveParams{Namespace: "default", Key: key, As: residual.Succeeded, By: "x" + title,
			Note: "n" + forged, Evidence: "e" + clear})
		require.ErrorIs(t, err, ledger.ErrInvalidParams, "a resolver with control characters is refused")
		_, err = l.Resolve(t.Context(), ledger.ResolveParams{Namespace: "default", Key: key, As: residual.Succeeded, By: "x\u202e",
			Note: "n" + forged, Evidence: "e" + clear})
		require.NoError(t, err)
	})
	for _, args := range [][]string{{"ls"}, {"ls", "--wide"}, {"show", key}} {
		out := ok(t, append(args, "--store", f.dir)...).stdout
		require.NotContains(t, out, "\x1b", "%v", args)
		require.NotContains(t, out, "\x07", "%v", args)
		require.NotContains(t, out, "\u202e", "%v", args)
		require.NotRegexp(t, `(?m)^next: nothing to do`, out, "%v: a forged line", args)
		require.Contains(t, out, `run\x1b]0;pwn`, "%v", args)
	}
	show := ok(t, "show", key, "--store", f.dir).stdout
	require.Contains(t, show, `invoice:1\nnext: nothing to do, all settled`)
	require.Contains(t, show, `holder agent\u202e`)

	var got record
	require.NoError(t, json.Unmarshal([]byte(ok(t, "show", key, "--store", f.dir, "--json").stdout), &got))
	require.Equal(t, task, got.Task, "JSON stays exact")
	require.Equal(t, target, got.Target)
	require.Equal(t, holder, got.Attempts[0].Holder)
	require.Equal(t, "late"+forged+title, got.Evidence[0].Note)
	require.Equal(t, "n"+forged, got.Resolutions[0].Note)
	rs := jsonLines(t, ok(t, "ls", "--store", f.dir, "--json").stdout)
	require.Equal(t, task, rs[0].Task)
}

func TestSafe(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain text, ünïcode ✓": "plain text, ünïcode ✓",
		`C:\path`:               `C:\path`,
		"a\x1b[31mred":          `a\x1b[31mred`,
		"a\nb\tc\r":             `a\nb\tc\r`,
		"a\\n\n":                `a\\n\n`,
		"\u202egnp.exe":         `\u202egnp.exe`,
		"\u009b31m":             `\u009b31m`,
		"bad\xffutf8":           `bad\xffutf8`,
	} {
		require.Equal(t, want, safe(in), "%q", in)
	}
}
