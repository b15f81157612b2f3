package main

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// pgSchema returns a fresh schema name, dropped when the test ends, and the DSN of the test
// server that selects it. It fails the test when no server answers: the PostgreSQL tests
// never skip.
func pgSchema(t *testing.T, prefix string) (schema, dsn string, conn *pgx.Conn) {
	t.Helper()
	dsn = testkit.PostgresDSN(t)
	schema = testkit.Schema(t, prefix)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err, "the PostgreSQL tests need a server at TOOLFENCE_TEST_PG=%q (make test starts one via .ci/run)", dsn)
	t.Cleanup(func() { _ = conn.Close(context.Background()) }) // before the schema's drop
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return schema, u.String(), conn
}

// TestMigrate runs `toolfence migrate` up, down and --status on a schema of its own, and
// against a schema a newer toolfence migrated.
func TestMigrate(t *testing.T) {
	t.Parallel()
	schema, store, conn := pgSchema(t, "tf_cli_migrate_")
	latest := postgres.LatestVersion()
	require.GreaterOrEqual(t, latest, 1)
	where := displayStore(store)
	tables := func() int {
		var n int
		require.NoError(t, conn.QueryRow(t.Context(),
			`SELECT count(*) FROM information_schema.tables WHERE table_schema = $1`, schema).Scan(&n))
		return n
	}

	r := ok(t, "migrate", "--status", "--store", store)
	require.Equal(t, fmt.Sprintf("%s: schema version 0, this binary knows up to %d: no toolfence tables yet; %d migration(s) pending: "+
		"run toolfence migrate (serve, demo and ledgers opened from Go also create it)\n", where, latest, latest), r.stdout)
	require.Zero(t, tables(), "--status writes nothing")

	// Commands that only look at or maintain a store do not create one where there is none.
	testkit.CreateSchema(t, schema)
	for _, args := range [][]string{{"ls"}, {"gc", "--older-than", "1h"}} {
		fails(t, 1, []string{"no toolfence store there", "has no toolfence tables: nothing has been recorded there"}, append(args, "--store", store)...)
	}
	require.Zero(t, tables(), "ls and gc create nothing")
	// --down never migrates up.
	r = ok(t, "migrate", "--down", fmt.Sprint(latest), "--yes", "--store", store)
	require.Equal(t, fmt.Sprintf("%s: schema version 0, already at or below %d (nothing to do)\n", where, latest), r.stdout)
	require.Zero(t, tables(), "--down on an empty schema creates nothing")

	// Up: the schema named by search_path is created.
	r = ok(t, "migrate", "--store", store)
	require.Equal(t, fmt.Sprintf("%s: schema version 0 → %d\n", where, latest), r.stdout)
	require.Positive(t, tables())
	r = ok(t, "migrate", "--store", store)
	require.Equal(t, fmt.Sprintf("%s: schema version %d, up to date (nothing to do)\n", where, latest), r.stdout)
	r = ok(t, "migrate", "--status", "--store", store)
	require.Contains(t, r.stdout, fmt.Sprintf("schema version %d, this binary knows up to %d: up to date\n", latest, latest))
	require.Regexp(t, `(?m)^  0001 init  applied \d{4}-\d\d-\d\dT`, r.stdout)

	// The commands use the migrated store.
	require.Contains(t, ok(t, "ls", "--store", store).stderr, "no residuals in namespace default of store "+where)

	// Down to 0 without --yes changes nothing; with it, it removes every table; again is a no-op.
	before := tables()
	fails(t, 2, []string{"nothing was changed: add --yes to do it"}, "migrate", "--down", "0", "--store", store)
	require.Equal(t, before, tables(), "--down without --yes drops nothing")
	r = ok(t, "migrate", "--down", "0", "--yes", "--store", store)
	require.Equal(t, fmt.Sprintf("%s: schema version %d → 0\n", where, latest), r.stdout)
	require.Zero(t, tables())
	r = ok(t, "migrate", "--down", "0", "--yes", "--store", store)
	require.Equal(t, fmt.Sprintf("%s: schema version 0, already at or below 0 (nothing to do)\n", where), r.stdout)

	// A schema migrated by a newer toolfence: refused with both versions, nothing written.
	ok(t, "migrate", "--store", store)
	newer := latest + 5
	_, err := conn.Exec(t.Context(), `INSERT INTO `+pgx.Identifier{schema, "toolfence_schema_migrations"}.Sanitize()+` (version, name) VALUES ($1, 'from_the_future')`, newer)
	require.NoError(t, err)
	before = tables()
	want := fmt.Sprintf("the schema of %s is at version %d, newer than this binary knows (up to %d): it was migrated by a newer toolfence; upgrade toolfence (nothing was changed)",
		where, newer, latest)
	fails(t, 1, []string{want}, "migrate", "--store", store)
	fails(t, 1, []string{want}, "migrate", "--down", "0", "--yes", "--store", store)
	require.Equal(t, before, tables(), "nothing was changed")
	r = ok(t, "migrate", "--status", "--store", store)
	require.Contains(t, r.stdout, fmt.Sprintf("schema version %d, this binary knows up to %d: newer than this binary: upgrade toolfence\n", newer, latest))
	require.Contains(t, r.stdout, fmt.Sprintf("  %04d from_the_future  applied ", newer))
	// Opening the store for other commands is refused too.
	fails(t, 1, []string{"postgres: database schema is newer than this binary"}, "ls", "--store", store)
}

func TestMigrateUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fails(t, 2, []string{"migrations apply only to PostgreSQL stores (--store postgres://…); " + dir + " names a badger directory store"},
		"migrate", "--store", dir)
	dsn := "postgres://u:secret@127.0.0.1:1/db"
	latest := postgres.LatestVersion()
	fails(t, 2, []string{fmt.Sprintf("--down -1: want a version from 0 to %d", latest)}, "migrate", "--down", "-1", "--store", dsn)
	fails(t, 2, []string{fmt.Sprintf("--down %d: want a version from 0 to %d", latest+1, latest)}, "migrate", "--down", fmt.Sprint(latest+1), "--store", dsn)
	fails(t, 2, []string{"give --down N or --status, not both"}, "migrate", "--down", "0", "--status", "--store", dsn)
	fails(t, 2, []string{"--down 0 removes toolfence's tables and every residual in them", "nothing was changed: add --yes to do it"},
		"migrate", "--down", "0", "--store", dsn)
	fails(t, 2, []string{"--down 1 reverts the migrations newer than 1, which can delete data", "add --yes"}, "migrate", "--down", "1", "--store", dsn)
	fails(t, 2, []string{"--yes confirms --down N"}, "migrate", "--yes", "--store", dsn)
	for _, args := range [][]string{{"migrate"}, {"migrate", "--status"}, {"migrate", "--down", "0", "--yes"}} {
		r := fails(t, 1, []string{"127.0.0.1:1"}, append(args, "--store", dsn)...)
		require.NotContains(t, r.stderr, "secret", "a DSN's password never shows")
	}
}

// TestMigrateDownZeroRefusesOpenResiduals: --down 0 --yes on a store with 3 unknown
// residuals (and a settled one) is refused, naming them and the flag that confirms their
// number; a wrong number is refused too; the right one drops the store.
func TestMigrateDownZeroRefusesOpenResiduals(t *testing.T) {
	t.Parallel()
	schema, store, conn := pgSchema(t, "tf_cli_dropopen_")
	ctx := t.Context()
	l, err := postgres.Open(ctx, store, postgres.Options{Schema: schema})
	require.NoError(t, err)
	var keys []string
	for i := range 4 {
		target := fmt.Sprint("invoice:", i)
		p := ledger.ReserveParams{Namespace: "default", Key: residual.Key("default", "task", "charge", target), Task: "task",
			Operation: "charge", Target: target, Holder: "agent", RequestDigest: "d", TTL: time.Minute}
		res, err := l.Reserve(ctx, p)
		require.NoError(t, err)
		outcome := residual.Unknown
		if i == 3 {
			outcome = residual.Succeeded
		} else {
			keys = append(keys, p.Key)
		}
		_, err = l.Commit(ctx, ledger.CommitParams{Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
			Outcome: outcome, Result: []byte(`{}`), Error: "timeout"})
		require.NoError(t, err)
	}
	require.NoError(t, l.Close())
	where := displayStore(store)
	tables := func() int {
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1`, schema).Scan(&n))
		return n
	}
	before := tables()

	r := fails(t, 1, []string{where + " holds 3 open residuals (unknown " + keys[0] + " in namespace default, unknown " + keys[1] +
		" in namespace default, unknown " + keys[2] + " in namespace default)", "Nothing was changed", "add --yes-drop-open 3"},
		"migrate", "--down", "0", "--yes", "--store", store)
	require.NotContains(t, r.stderr, "and 0 more")
	require.Equal(t, before, tables(), "nothing was dropped")
	fails(t, 1, []string{"--yes-drop-open 2, but " + where + " holds 3 open residuals now", "nothing was changed"},
		"migrate", "--down", "0", "--yes", "--yes-drop-open", "2", "--store", store)
	require.Equal(t, before, tables(), "nothing was dropped")
	fails(t, 2, []string{"--yes-drop-open confirms dropping open residuals, which only --down 0 does"},
		"migrate", "--down", "1", "--yes", "--yes-drop-open", "3", "--store", store)
	fails(t, 2, []string{"add --yes"}, "migrate", "--down", "0", "--yes-drop-open", "3", "--store", store)

	r = ok(t, "migrate", "--down", "0", "--yes", "--yes-drop-open", "3", "--store", store)
	require.Contains(t, r.stdout, "→ 0")
	require.Zero(t, tables())
}
