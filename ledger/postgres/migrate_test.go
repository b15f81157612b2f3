package postgres_test

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// tables lists the tables of schema.
func tables(t *testing.T, conn *pgx.Conn, schema string) []string {
	t.Helper()
	return names(t, conn, `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, schema)
}

// names returns the one text column of query's rows.
func names(t *testing.T, conn *pgx.Conn, query string, args ...any) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), query, args...)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

func TestMigrateUpDownIdempotent(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	ctx := context.Background()
	opts := postgres.Options{Schema: schema}
	latest := postgres.LatestVersion()
	require.GreaterOrEqual(t, latest, 1)

	from, to, err := postgres.Migrate(ctx, testDSN(), opts)
	require.NoError(t, err)
	require.Equal(t, 0, from)
	require.Equal(t, latest, to)
	from, to, err = postgres.Migrate(ctx, testDSN(), opts)
	require.NoError(t, err)
	require.Equal(t, [2]int{latest, latest}, [2]int{from, to}, "a second migrate does nothing")

	admin := adminConn(t, schema)
	require.Equal(t, []string{"toolfence_residuals", "toolfence_schema_migrations", "toolfence_watchers"},
		tables(t, admin, schema))

	// The up SQL itself is idempotent: running it again over the migrated schema works.
	for v := 1; v <= latest; v++ {
		_, err := admin.Exec(ctx, `DELETE FROM toolfence_schema_migrations WHERE version = $1`, v)
		require.NoError(t, err)
	}
	from, to, err = postgres.Migrate(ctx, testDSN(), opts)
	require.NoError(t, err)
	require.Equal(t, [2]int{0, latest}, [2]int{from, to})

	from, to, err = postgres.MigrateDown(ctx, testDSN(), 0, postgres.DownOptions{Options: opts})
	require.NoError(t, err)
	require.Equal(t, [2]int{latest, 0}, [2]int{from, to})
	require.Empty(t, tables(t, admin, schema), "down to 0 removes every toolfence table")

	_, _, err = postgres.MigrateDown(ctx, testDSN(), latest+1, postgres.DownOptions{Options: opts})
	require.Error(t, err)

	// Open migrates automatically; the ledger works after a down and up cycle.
	l := open(t, schema, postgres.Options{})
	_, err = l.Reserve(ctx, params("after-down", "h"))
	require.NoError(t, err)
}

func TestConcurrentOpenersMigrateOnce(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() {
			l, err := postgres.Open(context.Background(), testDSN(), postgres.Options{Schema: schema})
			errs[i] = err
			if err == nil {
				errs[i] = l.Close()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, adminConn(t, schema).QueryRow(context.Background(),
		`SELECT count(*) FROM toolfence_schema_migrations`).Scan(&n))
	require.Equal(t, postgres.LatestVersion(), n)
}

func TestSchemaTooNewWritesNothing(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	ctx := context.Background()
	admin := adminConn(t, schema)
	testkit.CreateSchema(t, schema)
	_, err := admin.Exec(ctx, `CREATE TABLE toolfence_schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
		INSERT INTO toolfence_schema_migrations (version, name) VALUES (999, 'from_the_future')`)
	require.NoError(t, err)

	for _, disable := range []bool{false, true} {
		_, err = postgres.Open(ctx, testDSN(), postgres.Options{Schema: schema, DisableAutoMigrate: disable})
		require.ErrorIs(t, err, postgres.ErrSchemaTooNew)
		require.Contains(t, err.Error(), "999")
	}
	_, _, err = postgres.Migrate(ctx, testDSN(), postgres.Options{Schema: schema})
	require.ErrorIs(t, err, postgres.ErrSchemaTooNew)
	_, _, err = postgres.MigrateDown(ctx, testDSN(), 0, postgres.DownOptions{Options: postgres.Options{Schema: schema}})
	require.ErrorIs(t, err, postgres.ErrSchemaTooNew)

	require.Equal(t, []string{"toolfence_schema_migrations"}, tables(t, admin, schema), "no table was created")
	var versions []int
	rows, err := admin.Query(ctx, `SELECT version FROM toolfence_schema_migrations`)
	require.NoError(t, err)
	versions, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{999}, versions)
}

func TestDisableAutoMigrate(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	ctx := context.Background()
	_, err := postgres.Open(ctx, testDSN(), postgres.Options{Schema: schema, DisableAutoMigrate: true})
	require.ErrorIs(t, err, postgres.ErrSchemaOutdated)
	require.Contains(t, err.Error(), "toolfence migrate")

	_, _, err = postgres.Migrate(ctx, testDSN(), postgres.Options{Schema: schema})
	require.NoError(t, err)
	l, err := postgres.Open(ctx, testDSN(), postgres.Options{Schema: schema, DisableAutoMigrate: true})
	require.NoError(t, err)
	require.NoError(t, l.Close())
}

func TestBadDSNs(t *testing.T) {
	t.Parallel()
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(testDSN())
	require.NoError(t, err)
	const secret = "s3cr3t-pw-do-not-print"

	cases := []struct {
		name, dsn string
		want      error
		mentions  []string
	}{
		{"unreachable", "postgres://alice:" + secret + "@127.0.0.1:1/test?sslmode=disable&connect_timeout=2",
			ledger.ErrUnavailable, []string{"127.0.0.1:1", "test", "alice"}},
		// sslmode=prefer: pgx tries TLS, then plain, and reports both tries alike.
		{"unreachable, two tries", "postgres://alice:" + secret + "@127.0.0.1:1/test",
			ledger.ErrUnavailable, []string{"127.0.0.1:1", "connection refused"}},
		{"wrong database", "postgres://" + cfg.User + ":" + secret + "@" + cfg.Host + ":" + strconv.Itoa(int(cfg.Port)) + "/toolfence_no_such_db?sslmode=disable",
			ledger.ErrUnavailable, []string{"toolfence_no_such_db", cfg.Host}},
		{"malformed url", "postgres://bob:" + secret + "@127.0.0.1:notaport/test", postgres.ErrInvalidDSN, nil},
		{"malformed kv", "host=127.0.0.1 password=" + secret + " port=notaport", postgres.ErrInvalidDSN, nil},
		{"empty", "  ", postgres.ErrInvalidDSN, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := postgres.Open(ctx, c.dsn, postgres.Options{})
			require.Nil(t, l)
			t.Log(err)
			require.ErrorIs(t, err, c.want)
			require.NotContains(t, err.Error(), secret, "the password never appears in an error")
			for _, m := range c.mentions {
				require.Contains(t, err.Error(), m)
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				require.Equal(t, 1, strings.Count(err.Error(), line), "the error says %q twice", line)
			}
			_, _, err = postgres.Migrate(ctx, c.dsn, postgres.Options{})
			require.ErrorIs(t, err, c.want)
			require.NotContains(t, err.Error(), secret)
		})
	}
}

// A DSN whose search_path names a schema that does not exist gets a clear error, and no
// schema is created behind the operator's back unless Options.Schema asks for it.
func TestMissingSearchPathSchema(t *testing.T) {
	t.Parallel()
	schema := newSchema(t) // never created here
	dsn := withParams(url.Values{"search_path": {schema}})
	_, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	require.ErrorIs(t, err, postgres.ErrNoStore)
	require.Contains(t, err.Error(), "no schema of search_path")
	require.Contains(t, err.Error(), schema)
	_, err = postgres.Open(context.Background(), dsn, postgres.Options{MustExist: true})
	require.ErrorIs(t, err, postgres.ErrNoStore)

	l, err := postgres.Open(context.Background(), dsn, postgres.Options{Schema: schema})
	require.NoError(t, err)
	require.Equal(t, schema, l.Schema())
	require.NoError(t, l.Close())
}

// MigrateDown never migrates up, Open with MustExist creates nothing where toolfence has no
// tables, and Status reads the applied migrations without writing.
func TestNothingIsCreatedWhereNotAsked(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	ctx := context.Background()
	opts := postgres.Options{Schema: schema}
	admin := adminConn(t, schema)
	testkit.CreateSchema(t, schema)
	latest := postgres.LatestVersion()

	from, to, err := postgres.MigrateDown(ctx, testDSN(), latest, postgres.DownOptions{Options: opts})
	require.NoError(t, err)
	require.Equal(t, [2]int{0, 0}, [2]int{from, to}, "down to a version above the schema's does nothing")
	require.Empty(t, tables(t, admin, schema))

	_, err = postgres.Open(ctx, testDSN(), postgres.Options{Schema: schema, MustExist: true})
	require.ErrorIs(t, err, postgres.ErrNoStore)
	require.ErrorContains(t, err, "(user postgres, search_path "+schema+")")
	require.Empty(t, tables(t, admin, schema), "MustExist creates nothing")

	applied, err := postgres.Status(ctx, testDSN(), opts)
	require.NoError(t, err)
	require.Empty(t, applied)

	_, _, err = postgres.MigrateDown(ctx, testDSN(), 0, postgres.DownOptions{Options: opts}) // nothing to revert either
	require.NoError(t, err)
	_, _, err = postgres.Migrate(ctx, testDSN(), opts)
	require.NoError(t, err)
	from, to, err = postgres.MigrateDown(ctx, testDSN(), latest, postgres.DownOptions{Options: opts})
	require.NoError(t, err)
	require.Equal(t, [2]int{latest, latest}, [2]int{from, to})
	applied, err = postgres.Status(ctx, testDSN(), opts)
	require.NoError(t, err)
	require.Len(t, applied, latest)
	require.Equal(t, 1, applied[0].Version)
	require.Equal(t, "init", applied[0].Name)
	require.WithinDuration(t, time.Now(), applied[latest-1].At, time.Minute)

	l, err := postgres.Open(ctx, testDSN(), postgres.Options{Schema: schema, MustExist: true})
	require.NoError(t, err, "an existing store opens with MustExist")
	require.NoError(t, l.Close())

	_, err = postgres.Status(ctx, "postgres://u@127.0.0.1:1/db?connect_timeout=2", postgres.Options{})
	require.ErrorIs(t, err, ledger.ErrUnavailable)
}

// Migration 2 moves the token counters of collected keys into tombstones and back: across
// an up and a down, no key's token ever goes back, and tombstones are never read as
// residuals.
func TestMigrationKeepsTokensAcrossVersions(t *testing.T) {
	t.Parallel()
	schema, opts := migrated(t)
	ctx := context.Background()
	_, to, err := postgres.MigrateDown(ctx, testDSN(), 1, postgres.DownOptions{Options: opts})
	require.NoError(t, err)
	require.Equal(t, 1, to)

	// At version 1 key A was reserved 7 times and then collected: only its counter is left.
	admin := adminConn(t, schema)
	pa := params("A", "h")
	_, err = admin.Exec(ctx, `INSERT INTO toolfence_tokens (namespace, key, token) VALUES ($1, $2, 7)`, pa.Namespace, pa.Key)
	require.NoError(t, err)

	l := open(t, schema, postgres.Options{}) // migrates to the latest version
	require.NotContains(t, tables(t, admin, schema), "toolfence_tokens")
	_, err = l.Get(ctx, ledger.GetParams{Namespace: pa.Namespace, Key: pa.Key})
	require.ErrorIs(t, err, residual.ErrNotFound, "a tombstone is not a residual")
	page, err := l.List(ctx, ledger.ListParams{Namespace: ns})
	require.NoError(t, err)
	require.Empty(t, page.Residuals)
	ra, err := l.Reserve(ctx, pa)
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, ra.Decision)
	require.Equal(t, uint64(8), ra.Lease.Token, "the counter of a key collected at version 1 carries on")
	_, err = l.Commit(ctx, commitOf(pa, ra, residual.Succeeded))
	require.NoError(t, err)

	// Key C is settled and collected at version 2: a tombstone holds its token.
	pc := params("C", "h")
	rc, err := l.Reserve(ctx, pc)
	require.NoError(t, err)
	_, err = l.Commit(ctx, commitOf(pc, rc, residual.Failed))
	require.NoError(t, err)
	gc, err := l.GC(ctx, ledger.GCParams{Namespace: ns, Before: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Equal(t, 2, gc.Deleted)
	_, err = l.Get(ctx, ledger.GetParams{Namespace: pc.Namespace, Key: pc.Key})
	require.ErrorIs(t, err, residual.ErrNotFound)
	_, err = l.Commit(ctx, commitOf(pc, rc, residual.Succeeded))
	require.ErrorIs(t, err, residual.ErrLeaseLost, "a collected key takes no commit")
	var state string
	var token int64
	require.NoError(t, admin.QueryRow(ctx, `SELECT state, token FROM toolfence_residuals WHERE key = $1`, pc.Key).Scan(&state, &token))
	require.Equal(t, [2]any{"collected", int64(1)}, [2]any{state, token})
	_, err = admin.Exec(ctx, `DELETE FROM toolfence_residuals WHERE key = $1`, pc.Key)
	require.ErrorContains(t, err, "never deleted since schema version 2", "an older GC cannot drop a tombstone")
	require.NoError(t, l.Close())

	// Down to 1: every key's token is back in toolfence_tokens and the tombstones are gone.
	_, _, err = postgres.MigrateDown(ctx, testDSN(), 1, postgres.DownOptions{Options: opts})
	require.NoError(t, err)
	rows, err := admin.Query(ctx, `SELECT key, token FROM toolfence_tokens ORDER BY token`)
	require.NoError(t, err)
	type kt struct {
		Key   string
		Token int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[kt])
	require.NoError(t, err)
	require.Equal(t, []kt{{pc.Key, 1}, {pa.Key, 8}}, got)
	var n int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM toolfence_residuals`).Scan(&n))
	require.Equal(t, 0, n, "the tombstones are deleted")

	// And up again: C continues after its tombstone.
	l = open(t, schema, postgres.Options{})
	rc, err = l.Reserve(ctx, pc)
	require.NoError(t, err)
	require.Equal(t, uint64(2), rc.Lease.Token)
	require.Len(t, rc.Residual.Attempts, 1, "a key reserved after GC starts with a fresh history")
}

// Migration 2 converts the counters of the schema it migrates only, even when the
// search_path names another toolfence schema after it.
func TestMigrationTouchesOnlyItsSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mine, other := newSchema(t), newSchema(t)
	for _, schema := range []string{mine, other} { // both at version 1, each with a collected key
		_, _, err := postgres.Migrate(ctx, testDSN(), postgres.Options{Schema: schema})
		require.NoError(t, err)
		_, _, err = postgres.MigrateDown(ctx, testDSN(), 1, postgres.DownOptions{Options: postgres.Options{Schema: schema}})
		require.NoError(t, err)
		_, err = adminConn(t, schema).Exec(ctx, `INSERT INTO toolfence_tokens (namespace, key, token) VALUES ('ns', $1, 9)`, schema)
		require.NoError(t, err)
	}

	from, to, err := postgres.Migrate(ctx, withParams(url.Values{"search_path": {mine + "," + other}}), postgres.Options{})
	require.NoError(t, err)
	require.Equal(t, [2]int{1, postgres.LatestVersion()}, [2]int{from, to})

	my := adminConn(t, mine)
	require.NotContains(t, tables(t, my, mine), "toolfence_tokens")
	var keys []string
	rows, err := my.Query(ctx, `SELECT key FROM toolfence_residuals WHERE state = 'collected'`)
	require.NoError(t, err)
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{mine}, keys, "my counter became my tombstone, and only mine")

	// Migration 2 runs again over my schema (its SQL must be re-runnable): my schema has no
	// counters left, the other one has.
	_, err = my.Exec(ctx, `DELETE FROM toolfence_schema_migrations WHERE version = 2`)
	require.NoError(t, err)
	_, _, err = postgres.Migrate(ctx, withParams(url.Values{"search_path": {mine + "," + other}}), postgres.Options{})
	require.NoError(t, err)
	rows, err = my.Query(ctx, `SELECT key FROM toolfence_residuals WHERE state = 'collected'`)
	require.NoError(t, err)
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{mine}, keys, "nothing of the other schema was imported")

	theirs := adminConn(t, other)
	require.Contains(t, tables(t, theirs, other), "toolfence_tokens", "the other schema keeps its counters")
	var n int
	require.NoError(t, theirs.QueryRow(ctx, `SELECT count(*) FROM toolfence_tokens`).Scan(&n))
	require.Equal(t, 1, n)
	require.NoError(t, theirs.QueryRow(ctx, `SELECT max(version) FROM toolfence_schema_migrations`).Scan(&n))
	require.Equal(t, 1, n, "the other schema is still at version 1")
}

// migrated returns a fresh schema migrated to the latest version and the options naming it.
func migrated(t *testing.T) (string, postgres.Options) {
	t.Helper()
	schema := newSchema(t)
	opts := postgres.Options{Schema: schema}
	_, _, err := postgres.Migrate(context.Background(), testDSN(), opts)
	require.NoError(t, err)
	return schema, opts
}

// indexes returns the names of the indexes of toolfence_residuals in schema.
func indexes(t *testing.T, conn *pgx.Conn, schema string) []string {
	t.Helper()
	return names(t, conn, `SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = 'toolfence_residuals' ORDER BY 1`, schema)
}

// Migration 0005 adds the filter indexes and its down removes exactly them; 0006 drops
// 0004's index of the open residuals (0005's serves the gauges) and its down brings it
// back; 0007 replaces 0005's filter indexes with ones that lead with their field and its
// down brings 0005's back; the listing works at every version.
func TestMigrationFilterIndexesUpDown(t *testing.T) {
	t.Parallel()
	schema, opts := migrated(t)
	ctx := context.Background()
	admin := adminConn(t, schema)
	latest := []string{"toolfence_residuals_by_operation", "toolfence_residuals_by_target", "toolfence_residuals_by_task",
		"toolfence_residuals_open_key", "toolfence_residuals_pkey"}
	require.Equal(t, latest, indexes(t, admin, schema))
	v6 := []string{"toolfence_residuals_open_key", "toolfence_residuals_operation", "toolfence_residuals_pkey",
		"toolfence_residuals_target", "toolfence_residuals_task"}
	before := []string{"toolfence_residuals_open", "toolfence_residuals_pkey"}

	from, to, err := postgres.MigrateDown(ctx, testDSN(), 6, postgres.DownOptions{Options: opts})
	require.NoError(t, err)
	require.Equal(t, [2]int{postgres.LatestVersion(), 6}, [2]int{from, to})
	require.Equal(t, v6, indexes(t, admin, schema), "down to 6 brings 0005's filter indexes back")
	from, to, err = postgres.MigrateDown(ctx, testDSN(), 5, postgres.DownOptions{Options: opts})
	require.NoError(t, err)
	require.Equal(t, [2]int{6, 5}, [2]int{from, to})
	require.ElementsMatch(t, append([]string{"toolfence_residuals_open"}, v6...), indexes(t, admin, schema),
		"down to 5 brings 0004's index back")
	from, to, err = postgres.MigrateDown(ctx, testDSN(), 4, postgres.DownOptions{Options: opts})
	require.NoError(t, err)
	require.Equal(t, [2]int{5, 4}, [2]int{from, to})
	require.Equal(t, before, indexes(t, admin, schema), "down to 4 drops the filter indexes only")

	from, to, err = postgres.Migrate(ctx, testDSN(), opts)
	require.NoError(t, err)
	require.Equal(t, [2]int{4, postgres.LatestVersion()}, [2]int{from, to})
	require.Equal(t, latest, indexes(t, admin, schema))

	l := open(t, schema, postgres.Options{})
	p := params("after-down-up", "h")
	_, err = l.Reserve(ctx, p)
	require.NoError(t, err)
	page, err := l.List(ctx, ledger.ListParams{Namespace: ns, Task: p.Task, States: []residual.State{residual.Pending}})
	require.NoError(t, err)
	require.Len(t, page.Residuals, 1)
}
