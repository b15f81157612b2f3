package postgres_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// TestMain runs a child role of the multi-process test when asked to, and otherwise the
// tests, checking that none leaks a goroutine.
func TestMain(m *testing.M) {
	testkit.RunRole(map[string]func() int{"reserver": testkit.RoleFunc("child", reserver)})
	goleak.VerifyTestMain(m)
}

// testDSN is the server the tests use: TOOLFENCE_TEST_PG, else the local default.
func testDSN() string { return testkit.PostgresURL() }

var (
	serverOnce sync.Once
	serverErr  error
)

// requireServer fails the test loudly when no PostgreSQL answers at testDSN. Only an
// explicit TOOLFENCE_SKIP_PG=1 outside CI turns that into a skip; with CI=true it always
// fails.
func requireServer(t testing.TB) {
	t.Helper()
	testkit.SkipShort(t, "needs PostgreSQL (TOOLFENCE_TEST_PG)")
	serverOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, testDSN())
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		serverErr = err
	})
	if serverErr == nil {
		return
	}
	msg := fmt.Sprintf("THE POSTGRESQL SUITE DID NOT RUN: no server answers at TOOLFENCE_TEST_PG=%q: %v "+
		"(start one, e.g. with .ci/run, or set TOOLFENCE_SKIP_PG=1 outside CI to skip it)", redact(testDSN()), serverErr)
	if os.Getenv("CI") != "true" && os.Getenv("TOOLFENCE_SKIP_PG") == "1" {
		t.Skip(msg)
	}
	t.Fatal(msg)
}

func redact(dsn string) string {
	if i, j := strings.Index(dsn, "://"), strings.Index(dsn, "@"); i >= 0 && j > i {
		if k := strings.Index(dsn[i+3:j], ":"); k >= 0 {
			return dsn[:i+3+k+1] + "xxxxx" + dsn[j:]
		}
	}
	return dsn
}

// newSchema returns the name of a fresh schema that is dropped when the test ends. The
// schema itself is created by the ledger's migrations.
func newSchema(t testing.TB) string {
	t.Helper()
	requireServer(t)
	return testkit.Schema(t, "tf_test_")
}

// open opens a ledger on schema, closed when the test ends.
func open(t testing.TB, schema string, opts postgres.Options) *postgres.Ledger {
	t.Helper()
	opts.Schema = schema
	l, err := postgres.Open(context.Background(), testDSN(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// setup opens a ledger on a fresh schema.
func setup(t testing.TB) *postgres.Ledger {
	t.Helper()
	return open(t, newSchema(t), postgres.Options{})
}

// adminConn is a plain connection to the test schema for assertions and fault injection.
func adminConn(t testing.TB, schema string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(testDSN())
	require.NoError(t, err)
	cfg.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	cfg.RuntimeParams["application_name"] = "toolfence-test-admin"
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

const ns = "test"

// params returns reserve params for a call on target by holder.
func params(target, holder string) ledger.ReserveParams {
	return ledger.ReserveParams{
		Namespace: ns, Key: residual.Key(ns, "task-1", "op", target), Task: "task-1",
		Operation: "op", Target: target, Holder: holder, RequestDigest: "digest-" + target,
		TTL: 30 * time.Second,
	}
}

// commitOf returns commit params for the lease of an acquired reservation.
func commitOf(p ledger.ReserveParams, res *ledger.ReserveResult, outcome residual.State) ledger.CommitParams {
	return ledger.CommitParams{
		Namespace: p.Namespace, Key: p.Key, Holder: p.Holder, Token: res.Lease.Token,
		Outcome: outcome, ResponseDigest: "resp", Result: []byte(`{"ok":true}`), ResultDigest: "rd",
		Margin: 50 * time.Millisecond,
	}
}
