package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEvalCommand(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "report")
	r := ok(t, "eval", "--scenarios", "crash-b1,crash-b2", "--subjects", "toolfence-badger,none",
		"--trials", "1", "--out", out, "--no-pg")
	require.Contains(t, r.stdout, "toolfence-badger")
	require.Regexp(t, `crash-b1\s+1 ok \(1 rec\)\s+1 DUP`, r.stdout)
	require.Regexp(t, `crash-b2\s+1 ok\s+1 DUP`, r.stdout)
	for _, f := range []string{"report.json", "report.md", "report.svg"} {
		_, err := os.Stat(filepath.Join(out, f))
		require.NoError(t, err, f)
	}
	require.Contains(t, r.stderr, "2/4", "a progress bar on stderr")
}

func TestEvalCommandUsage(t *testing.T) {
	t.Parallel()
	fails(t, 2, []string{"--trials must be positive"}, "eval", "--trials", "0")
	fails(t, 2, []string{`unknown scenario "nope"`}, "eval", "--scenarios", "nope", "--no-pg")
	fails(t, 2, []string{`--host-revision "2024-11-05"`, "2026-07-28 or 2025-11-25"}, "eval", "--host-revision", "2024-11-05", "--no-pg")
}

// Without a DSN, or with one that does not answer, the PostgreSQL subject is left out and
// the run says so instead of silently showing fewer columns.
func TestEvalCommandSaysWhyPostgresIsLeftOut(t *testing.T) {
	t.Parallel()
	args := []string{"eval", "--scenarios", "crash-b0", "--subjects", "toolfence-badger", "--trials", "1", "--out", ""}
	r := tf(t, []string{"TOOLFENCE_TEST_PG="}, args...)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stderr, "no PostgreSQL DSN (--pg or $TOOLFENCE_TEST_PG); skipping toolfence-postgres")
	require.NotContains(t, r.stdout, "toolfence-postgres")

	r = tf(t, nil, append(args, "--pg", "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2")...)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stderr, "PostgreSQL does not answer")
	require.NotContains(t, r.stdout, "toolfence-postgres")
}

// TestEvalCommandProxy runs the MCP proxy subjects with the real commands: the worker (an MCP
// host) starts `toolfence proxy … -- toolfence eval-payments …`, or the relay; the proxy is
// settles b1 by its probe and replays at b2; the relay charges twice at both.
func TestEvalCommandProxy(t *testing.T) {
	t.Parallel()
	r := ok(t, "eval", "--scenarios", "crash-b1,crash-b2,crash-reserved", "--subjects", "toolfence-proxy,pass-through",
		"--trials", "1", "--out", "", "--no-pg")
	require.Regexp(t, `crash-b1\s+1 ok\s+1 DUP`, r.stdout)
	require.Regexp(t, `crash-b2\s+1 ok\s+1 DUP`, r.stdout)
	require.Regexp(t, `crash-reserved\s+-\s+-`, r.stdout, "the proxy subjects do not run the other scenarios")
}
