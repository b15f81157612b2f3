package main

import (
	"context"
	"encoding/json"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// TestPostgresStore runs the commands against a postgres:// store: a schema of its own,
// created and filled from this process, named in the DSN's search_path.
func TestPostgresStore(t *testing.T) {
	t.Parallel()
	dsn := testkit.PostgresDSN(t)
	schema := testkit.Schema(t, "tf_cli_")

	// An hour in the past on the server's clock: the reserved lease has expired by now.
	l, err := postgres.Open(t.Context(), dsn, postgres.Options{Schema: schema, TimeOffset: -time.Hour})
	require.NoError(t, err, "the PostgreSQL store tests need a server at TOOLFENCE_TEST_PG=%q (make test starts one via .ci/run)", dsn)
	f := &fixture{t: t}
	settled := f.settle(l, "default", "run-1", "charge", "invoice:1", residual.Succeeded)
	unknown, _ := f.reserve(l, "default", "run-1", "charge", "invoice:2", time.Minute)
	require.NoError(t, l.Close())

	u, err := url.Parse(dsn)
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	store := u.String()

	rs := jsonLines(t, ok(t, "ls", "--store", store, "--json").stdout)
	require.Len(t, rs, 2)
	states := map[string]residual.State{}
	for _, r := range rs {
		states[r.Key] = r.State
	}
	require.Equal(t, map[string]residual.State{settled: residual.Succeeded, unknown: residual.Unknown}, states)

	r := ok(t, "resolve", unknown, "--as", "failed", "--note", "not in the ledger of the bank", "--by", "bob", "--store", store)
	require.Contains(t, r.stdout, "resolved "+unknown+": unknown → failed by bob")
	var got record
	require.NoError(t, json.Unmarshal([]byte(ok(t, "show", unknown, "--store", store, "--json").stdout), &got))
	require.Equal(t, residual.Failed, got.State)

	r = ok(t, "gc", "--store", store, "--older-than", "0s")
	require.Contains(t, r.stdout, "deleted 2 settled residual(s)")
	require.Empty(t, jsonLines(t, ok(t, "ls", "--store", store, "--json").stdout))
}

// TestDemoOnPostgres tells the story on PostgreSQL: in a fresh schema per run, kept (with
// the commands to look at it) unless --rm drops it.
func TestDemoOnPostgres(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := testkit.PostgresDSN(t)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err, "the PostgreSQL store tests need a server at TOOLFENCE_TEST_PG=%q (make test starts one via .ci/run)", dsn)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) }) // after the drop below
	schemaOf := func(r result) string {
		m := regexp.MustCompile(`ledger: the fresh PostgreSQL schema (toolfence_demo_\w+)`).FindStringSubmatch(r.stdout)
		require.NotNil(t, m, "%s", r)
		return m[1]
	}
	exists := func(schema string) bool {
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&n))
		return n == 1
	}

	r := ok(t, "demo", "--store", dsn, "--rm")
	requireStory(t, r)
	first := schemaOf(r)
	require.False(t, exists(first), "with --rm the run's schema is dropped")

	r = ok(t, "demo", "--store", dsn)
	requireStory(t, r)
	kept := schemaOf(r)
	require.NotEqual(t, first, kept, "a fresh schema per run")
	t.Cleanup(func() {
		_, err := conn.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+pgx.Identifier{kept}.Sanitize()+` CASCADE`)
		require.NoError(t, err)
	})
	require.True(t, exists(kept), "the demo keeps its schema")
	m := regexp.MustCompile(`schema \S+ kept; look at it with:\n  \S+ ls --store '\S+'\n  \S+ show (tf1_[0-9a-f]{64}) --store '(\S+)'`).FindStringSubmatch(r.stderr)
	require.NotNil(t, m, "%s", r)
	var shown record
	require.NoError(t, json.Unmarshal([]byte(ok(t, "show", m[1], "--store", m[2], "--json").stdout), &shown))
	require.Equal(t, residual.Succeeded, shown.State)
	require.Equal(t, "invoice:INV-42", shown.Target)
	require.Len(t, shown.Attempts, 1)
	require.True(t, strings.HasPrefix(shown.Attempts[0].Holder, "demo-worker/pid-"), shown.Attempts[0].Holder)
	require.Len(t, shown.Resolutions, 1)
}
