package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

// bin is the toolfence binary TestMain builds; the tests run it as a user would.
var bin string

func TestMain(m *testing.M) {
	if os.Getenv(capsUpstreamEnv) != "" { // this test binary as an upstream (proxy_lock_caps_test.go)
		os.Exit(runCapsUpstream())
	}
	// Built without -race: the binary's concurrent parts (the demo's API, worker and
	// successor) run under the race detector in cmd/toolfence/internal/demo's tests.
	os.Exit(testkit.RunWithBinaries(m, func(dir string) { bin = filepath.Join(dir, "toolfence") }, "."))
}

// result is what one run of the binary did.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// tf runs the binary with args; env entries are added to a clean environment without
// TOOLFENCE_STORE, TOOLFENCE_SERVER and TOOLFENCE_TOKEN.
func tf(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return runIn(t, "", "", env, args...)
}

// runIn runs the binary as tf does, in directory dir ("" for this one) with stdin as its
// standard input.
func runIn(t *testing.T, dir, stdin string, env []string, args ...string) result {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(stdin)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, storeEnv+"=") && !strings.HasPrefix(kv, serverEnv+"=") && !strings.HasPrefix(kv, tokenEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running toolfence %v: %v", args, err)
	}
	return res
}

// ok runs the binary and requires exit status 0.
func ok(t *testing.T, args ...string) result {
	t.Helper()
	r := tf(t, nil, args...)
	require.Equal(t, 0, r.code, "toolfence %v\n%s", args, r)
	return r
}

// fails runs the binary and requires the exit status code and stderr containing every want.
func fails(t *testing.T, code int, want []string, args ...string) result {
	t.Helper()
	r := tf(t, nil, args...)
	require.Equal(t, code, r.code, "toolfence %v\n%s", args, r)
	for _, w := range want {
		require.Contains(t, r.stderr, w, "toolfence %v\n%s", args, r)
	}
	return r
}

// record is a residual as ls, show and resolve print it with --json: results are JSON values.
type record struct {
	residual.Residual
	Result   json.RawMessage `json:"result,omitempty"`
	Evidence []struct {
		residual.Evidence
		Result json.RawMessage `json:"result,omitempty"`
	} `json:"evidence,omitempty"`
}

// jsonLines parses ls --json output.
func jsonLines(t *testing.T, out string) []record {
	t.Helper()
	var rs []record
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r record
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), "line %q", sc.Text())
		rs = append(rs, r)
	}
	require.NoError(t, sc.Err())
	return rs
}

// tableRows returns the data rows of an ls table (without the header).
func tableRows(out string) []string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "KEY") {
		return nil
	}
	return lines[1:]
}

// fixture writes residuals into a store from this process, with the ledger's clock set
// to clock, and closes the store before the binary runs.
type fixture struct {
	t   *testing.T
	dir string
}

func newFixture(t *testing.T) *fixture { return &fixture{t: t, dir: t.TempDir()} }

// with opens the store with clock, runs fn and closes it.
func (f *fixture) with(clock lease.Clock, fn func(l ledger.Ledger)) {
	f.t.Helper()
	l, err := badger.Open(f.dir, badger.Options{Clock: clock})
	require.NoError(f.t, err)
	defer func() { require.NoError(f.t, l.Close()) }()
	fn(l)
}

// reserve reserves (task, op, target) in namespace ns and returns the key and token.
func (f *fixture) reserve(l ledger.Ledger, ns, task, op, target string, ttl time.Duration) (string, uint64) {
	f.t.Helper()
	key := residual.Key(ns, task, op, target)
	res, err := l.Reserve(f.t.Context(), ledger.ReserveParams{
		Namespace: ns, Key: key, Task: task, Operation: op, Target: target,
		Holder: "agent-1", RequestDigest: "d1", TTL: ttl,
	})
	require.NoError(f.t, err)
	require.Equal(f.t, ledger.Acquired, res.Decision)
	return key, res.Lease.Token
}

// settle reserves and commits outcome.
func (f *fixture) settle(l ledger.Ledger, ns, task, op, target string, outcome residual.State) string {
	f.t.Helper()
	key, token := f.reserve(l, ns, task, op, target, time.Minute)
	_, err := l.Commit(f.t.Context(), ledger.CommitParams{
		Namespace: ns, Key: key, Holder: "agent-1", Token: token, Outcome: outcome,
		Result: []byte(`{"ok":true}`), ResultDigest: "r1",
	})
	require.NoError(f.t, err)
	return key
}

// past is a fake clock an hour and a half behind: leases it grants have expired in real time.
func past(d time.Duration) *lease.Fake { return lease.NewFake(time.Now().Add(-d)) }
