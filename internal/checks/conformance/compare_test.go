package conformance

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The comparison on synthetic checks.json data: what each kind of difference reports.

const stamp = "-2026-07-28T10-00-00-000Z"

// writeScenario writes dir/NAME/checks.json with checks (no file when checks is nil).
func writeScenario(t *testing.T, dir, name string, checks []check) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, name), 0o755))
	if checks == nil {
		return
	}
	b, err := json.Marshal(checks)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name, "checks.json"), b, 0o644))
}

// synthetic reads a run made of scenarios (name → checks; nil: no checks.json) with output.
func synthetic(t *testing.T, prefix, output string, scenarios map[string][]check) results {
	t.Helper()
	dir := t.TempDir()
	for name, checks := range scenarios {
		writeScenario(t, dir, prefix+name+stamp, checks)
	}
	var r results
	require.NoError(t, r.readResults(dir, prefix, output))
	return r
}

func pass(id, desc string) check { return check{ID: id, Description: desc, Status: "SUCCESS"} }
func fail(id, desc, msg string) check {
	return check{ID: id, Description: desc, Status: "FAILURE", ErrorMessage: msg}
}

// TestReadResultsKeys: keys are scenario, id and description; a repeated id and description
// gets " #2"; a scenario without checks.json is broken with the suite's message; INFO and
// WARNING keep their status.
func TestReadResultsKeys(t *testing.T) {
	t.Parallel()
	r := synthetic(t, "server-", "Failed to run scenario tools-list: Error: HTTP 400\n", map[string][]check{
		"server-stateless": {pass("meta-400", "Rejections use 400."), pass("meta-400", "Rejections use 400."),
			{ID: "req", Description: "Sending POST\n  tools/call", Status: "INFO"}, {ID: "w", Description: "SHOULD", Status: "WARNING"}},
		"tools-list": nil,
		"ping":       nil,
	})
	assert.Equal(t, []string{
		"server-stateless | meta-400 | Rejections use 400.",
		"server-stateless | meta-400 | Rejections use 400. #2",
		"server-stateless | req | Sending POST tools/call",
		"server-stateless | w | SHOULD",
	}, slices.Sorted(maps.Keys(r.checks)))
	assert.Equal(t, map[string]string{
		"tools-list": "the suite failed to run it: Error: HTTP 400",
		"ping":       "the suite wrote no checks.json for it",
	}, r.broken)
	assert.Equal(t, "2 passed, 1 failed, 1 neither (INFO/SKIPPED), 2 scenario(s) without results", r.counts())
}

// TestReadResultsRejects: an entry that is no scenario directory, or a checks.json that does
// not parse, is an error naming it.
func TestReadResultsRejects(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeScenario(t, dir, "tools_call"+stamp, []check{pass("a", "b")})
	var r results
	require.ErrorContains(t, r.readResults(dir, "server-", ""), "tools_call"+stamp+" is not a result directory server-SCENARIO-TIMESTAMP")

	dir = t.TempDir()
	writeScenario(t, dir, "server-ping"+stamp, []check{})
	require.NoError(t, os.WriteFile(filepath.Join(dir, "server-ping"+stamp, "checks.json"), []byte("[{"), 0o644))
	require.ErrorContains(t, r.readResults(dir, "server-", ""), "scenario ping: unexpected end of JSON input")
}

// TestAgainstBaseline: a failing check the baseline lists is fine; one it does not list, an
// entry whose check passes now (unless flaky) and one no longer reported (even if flaky) are
// each a problem.
func TestAgainstBaseline(t *testing.T) {
	t.Parallel()
	got := synthetic(t, "server-", "", map[string][]check{
		"tasks-lifecycle": {fail("sync", "Sync tool", "unknown tool \"greet\""), fail("new", "New check", "it broke")},
		"ping":            {pass("ping", "Ping works")},
	})
	expect := map[string]expectation{
		"tasks-lifecycle | sync | Sync tool": {reason: "no task tools"},
		"ping | ping | Ping works":           {reason: "was broken once"},
		"gone | gone | Removed":              {reason: "a scenario that no longer exists", flaky: true},
	}
	sec := againstBaseline("direct", "direct 2026-07-28", got, expect)
	assert.Equal(t, "1 passed, 2 failed, 0 neither (INFO/SKIPPED)", sec.counts)
	assert.Equal(t, []string{
		`✗ tasks-lifecycle | new | New check → FAILURE: it broke (not in the baseline under "direct 2026-07-28")`,
		`stale baseline entry under "direct 2026-07-28": gone | gone | Removed is no longer reported (reason given: a scenario that no longer exists)`,
		`stale baseline entry under "direct 2026-07-28": ping | ping | Ping works → SUCCESS now (reason given: was broken once)`,
	}, sec.problems)

	// A flaky entry that passes now is no problem; the failing check listed is none either.
	delete(expect, "gone | gone | Removed")
	expect["ping | ping | Ping works"] = expectation{reason: "fails in some runs", flaky: true}
	expect["tasks-lifecycle | new | New check"] = expectation{reason: "known"}
	assert.Empty(t, againstBaseline("direct", "direct 2026-07-28", got, expect).problems)
}

// TestAgainstDirect: a check that passes directly and fails, is neither, or is missing
// through the proxy is a problem with its message, and so is one that fails only through the
// proxy; one that fails directly and through the proxy is not.
func TestAgainstDirect(t *testing.T) {
	t.Parallel()
	direct := synthetic(t, "", "", map[string][]check{
		"sse-retry":  {pass("timing", "Respects retry"), pass("last-id", "Sends Last-Event-ID"), pass("reconnect", "Reconnects")},
		"tools_call": {pass("add", "Adds"), fail("broken", "Broken directly", "x"), {ID: "info", Description: "Sent", Status: "INFO"}},
		"initialize": {pass("init", "Initializes")},
	})
	via := synthetic(t, "", "Failed to run scenario initialize: Error: HTTP 400: bad request\n", map[string][]check{
		"sse-retry": {fail("timing", "Respects retry", "Client reconnected too early (-73ms instead of 500ms)."),
			{ID: "last-id", Description: "Sends Last-Event-ID", Status: "WARNING", ErrorMessage: "no Last-Event-ID"}},
		"tools_call": {pass("add", "Adds"), fail("broken", "Broken directly", "x"), fail("info", "Sent", "not sent"),
			fail("event", "Received tool response", "Tool call failed")},
		"initialize": nil,
	})
	sec := againstDirect("proxy", "proxy-http 2026-07-28", direct, via, nil)
	assert.Equal(t, []string{
		"✗ initialize | init | Initializes → not reported through the proxy: the suite failed to run it: Error: HTTP 400: bad request (passes directly)",
		"✗ sse-retry | last-id | Sends Last-Event-ID → WARNING: no Last-Event-ID (passes directly)",
		"✗ sse-retry | reconnect | Reconnects → not reported through the proxy (passes directly)",
		"✗ sse-retry | timing | Respects retry → FAILURE: Client reconnected too early (-73ms instead of 500ms). (passes directly)",
		"✗ tools_call | event | Received tool response → FAILURE: Tool call failed (fails only through the proxy: not reported directly)",
		"✗ tools_call | info | Sent → FAILURE: not sent (fails only through the proxy: INFO directly)",
	}, sec.problems)
	rep := report{sec, againstDirect("same", "proxy-http 2026-07-28", direct, direct, nil)}
	assert.True(t, rep.failed())
	assert.False(t, report{rep[1]}.failed())
	out := rep.String()
	assert.True(t, strings.HasPrefix(out, "proxy: 1 passed, 5 failed, 0 neither (INFO/SKIPPED), 1 scenario(s) without results; 6 problem(s)\n    ✗ initialize"), out)
	assert.Contains(t, out, "\nsame: 5 passed, 1 failed, 1 neither (INFO/SKIPPED); 0 problem(s)\n")
}

// TestAgainstDirectBaseline: a proxy-only failure listed with its reason is no problem; an
// entry for a check that passes directly, or that does not fail through the proxy, is.
func TestAgainstDirectBaseline(t *testing.T) {
	t.Parallel()
	direct := synthetic(t, "", "", map[string][]check{"polling": {pass("ok", "Works")}})
	via := synthetic(t, "", "", map[string][]check{"polling": {pass("ok", "Works"), fail("event", "Received", "Tool call failed")}})
	expect := map[string]expectation{"polling | event | Received": {reason: "the upstream dropped the answer"}}
	assert.Empty(t, againstDirect("proxy", "proxy-http 2025-11-25", direct, via, expect).problems)
	expect["polling | ok | Works"] = expectation{reason: "wrongly listed"}
	assert.Equal(t, []string{`baseline entry under "proxy-http 2025-11-25" lists polling | ok | Works, which passes directly: a check that passes directly must pass through the proxy`},
		againstDirect("proxy", "proxy-http 2025-11-25", direct, via, expect).problems)
	delete(expect, "polling | ok | Works")
	fixed := synthetic(t, "", "", map[string][]check{"polling": {pass("ok", "Works"), pass("event", "Received")}})
	assert.Equal(t, []string{`stale baseline entry under "proxy-http 2025-11-25": polling | event | Received → SUCCESS now (reason given: the upstream dropped the answer)`},
		againstDirect("proxy", "proxy-http 2025-11-25", direct, fixed, expect).problems)
}

// TestLoadBaseline: groups give each check its reason; an unknown run or field, a group
// without reason or checks and a check listed twice are errors naming the problem.
func TestLoadBaseline(t *testing.T) {
	t.Parallel()
	runs := []string{"direct 2026-07-28", "serve 2026-07-28"}
	load := func(text string) (baseline, error) {
		path := filepath.Join(t.TempDir(), "baseline.yaml")
		require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
		return loadBaseline(path, runs)
	}
	b, err := load(`
direct 2026-07-28:
  - reason: no task
      tools
    checks:
      - 'a | b | it''s c'
      - 'a | b | d #2'
  - reason: a race
    flaky: true
    checks: ['x | y | z']
serve 2026-07-28: []
`)
	require.NoError(t, err)
	assert.Equal(t, baseline{"direct 2026-07-28": {"a | b | it's c": {reason: "no task tools"}, "a | b | d #2": {reason: "no task tools"},
		"x | y | z": {reason: "a race", flaky: true}}, "serve 2026-07-28": {}}, b)
	b, err = load("# nothing fails\n")
	require.NoError(t, err)
	assert.Empty(t, b)

	for text, want := range map[string]string{
		"direct 2025-11-25: []\n":                         `unknown run "direct 2025-11-25"`,
		"direct 2026-07-28:\n  - checks: ['a | b | c']\n": "group 1: each group needs a reason and its checks",
		"direct 2026-07-28:\n  - reason: r\n":             "group 1: each group needs a reason and its checks",
		"direct 2026-07-28:\n  - reason: r\n    checks: ['a | b | c']\n  - reason: s\n    checks: ['a | b | c']\n": `lists "a | b | c" twice`,
		"direct 2026-07-28:\n  - reason: r\n    check: ['a | b | c']\n":                                            "field check not found",
	} {
		_, err := load(text)
		assert.ErrorContains(t, err, want, text)
	}
}

// TestBaselineFileLoads: the checked-in baseline parses, names only known runs, and gives
// every check a reason.
func TestBaselineFileLoads(t *testing.T) {
	t.Parallel()
	b, err := loadBaseline(baselineFile, baselineRuns)
	require.NoError(t, err)
	for run, checks := range b {
		for key := range checks {
			assert.Len(t, strings.Split(key, " | "), 3, "%s: %q is not SCENARIO | ID | DESCRIPTION", run, key)
		}
	}
}

// TestClientScenariosHaveHosts: every client scenario the test runs has a host, and every
// host runs in some requirement set.
func TestClientScenariosHaveHosts(t *testing.T) {
	t.Parallel()
	run := map[string]bool{}
	for req, scenarios := range clientScenarios {
		for _, sc := range scenarios {
			assert.Contains(t, hostScenarios, sc, "%s runs %s, which has no host", req, sc)
			run[sc] = true
		}
	}
	for sc := range hostScenarios {
		assert.True(t, run[sc], "the host of %s runs in no requirement set", sc)
	}
}
