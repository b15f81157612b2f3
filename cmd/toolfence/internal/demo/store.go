package demo

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/ledger/postgres"
)

// IsDSN reports whether store names a PostgreSQL database (postgres:// or postgresql://)
// rather than a badger directory.
func IsDSN(store string) bool {
	return strings.HasPrefix(store, "postgres://") || strings.HasPrefix(store, "postgresql://")
}

// openLedger opens store: the PostgreSQL ledger for a DSN, else the badger directory.
func openLedger(ctx context.Context, store string) (ledger.Ledger, error) {
	if IsDSN(store) {
		return postgres.Open(ctx, store, postgres.Options{})
	}
	return badger.Open(store, badger.Options{})
}

// runSchema creates a fresh schema for one run in the database of dsn, migrated to the
// latest version, and returns its name and the DSN that selects it (search_path).
func runSchema(ctx context.Context, dsn string) (schema, runDSN string, err error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", "", fmt.Errorf("demo: the store is not a postgres:// URL: %w", err)
	}
	schema = "toolfence_demo_" + time.Now().UTC().Format("20060102t150405") + "_" + strings.ToLower(rand.Text()[:8])
	l, err := postgres.Open(ctx, dsn, postgres.Options{Schema: schema})
	if err != nil {
		return "", "", fmt.Errorf("demo: creating schema %s for the run: %w", schema, err)
	}
	if err := l.Close(); err != nil {
		return "", "", err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return schema, u.String(), nil
}

// dropSchema removes the run's schema and everything in it.
func dropSchema(ctx context.Context, dsn, schema string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("demo: dropping schema %s: %w", schema, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
		return fmt.Errorf("demo: dropping schema %s: %w", schema, err)
	}
	return nil
}
