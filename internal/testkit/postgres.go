package testkit

import (
	"cmp"
	"context"
	"crypto/rand"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresEnv names the variable that points the tests at a PostgreSQL server.
const PostgresEnv = "TOOLFENCE_TEST_PG"

// DefaultPostgresDSN is the server the tests use when PostgresEnv is unset: the local one
// that .ci/run starts.
const DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// PostgresURL returns $TOOLFENCE_TEST_PG, else DefaultPostgresDSN. It does not skip: for a
// TestMain or a helper without a test at hand; tests call PostgresDSN.
func PostgresURL() string {
	return cmp.Or(os.Getenv(PostgresEnv), DefaultPostgresDSN)
}

// PostgresDSN returns the test server's DSN (PostgresURL), skipping the test under -short:
// a test that asks for it needs PostgreSQL.
func PostgresDSN(tb testing.TB) string {
	tb.Helper()
	SkipShort(tb, "needs PostgreSQL ("+PostgresEnv+")")
	return PostgresURL()
}

// Schema returns the name of a fresh schema, prefix followed by random lower-case letters and
// digits, and drops it (CASCADE) when the test ends; a failed drop fails the test. It does not
// create the schema: toolfence's migrations do, or CreateSchema. It skips under -short.
func Schema(tb testing.TB, prefix string) string {
	tb.Helper()
	dsn := PostgresDSN(tb)
	name := prefix + strings.ToLower(rand.Text()[:16])
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			tb.Errorf("drop schema %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`); err != nil {
			tb.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// CreateSchema creates the (empty) schema name on the test server, failing the test on error:
// for tests of what toolfence does in a schema that exists but holds none of its tables.
func CreateSchema(tb testing.TB, name string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, PostgresDSN(tb))
	if err != nil {
		tb.Fatalf("create schema %s: %v", name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("create schema %s: %v", name, err)
	}
}
