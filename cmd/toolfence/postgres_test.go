package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// pgDSN is the test server: TOOLFENCE_TEST_PG, else the local default of the Makefile.
func pgDSN() string {
	return cmp.Or(os.Getenv("TOOLFENCE_TEST_PG"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// TestPostgresStore runs the commands against a postgres:// store: a schema of its own,
// created and filled from this process, named in the DSN's search_path.
func TestPostgresStore(t *testing.T) {
	t.Parallel()
	schema := "tf_cli_" + strings.ToLower(rand.Text()[:12])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, pgDSN())
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})

	// An hour in the past on the server's clock: the reserved lease has expired by now.
	l, err := postgres.Open(t.Context(), pgDSN(), postgres.Options{Schema: schema, TimeOffset: -time.Hour})
	require.NoError(t, err, "the PostgreSQL store tests need a server at TOOLFENCE_TEST_PG=%q (make test starts one via .ci/run)", pgDSN())
	f := &fixture{t: t}
	settled := f.settle(l, "default", "run-1", "charge", "invoice:1", residual.Succeeded)
	unknown, _ := f.reserve(l, "default", "run-1", "charge", "invoice:2", time.Minute)
	require.NoError(t, l.Close())

	u, err := url.Parse(pgDSN())
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
	var got residual.Residual
	require.NoError(t, json.Unmarshal([]byte(ok(t, "show", unknown, "--store", store, "--json").stdout), &got))
	require.Equal(t, residual.Failed, got.State)

	r = ok(t, "gc", "--store", store, "--older-than", "0s")
	require.Contains(t, r.stdout, "deleted 2 settled residual(s)")
	require.Empty(t, jsonLines(t, ok(t, "ls", "--store", store, "--json").stdout))
}
