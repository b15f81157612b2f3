package evals

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// dropSchema removes the schema a run's toolfence-postgres workers used.
func dropSchema(dsn, schema string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("evals: dropping schema %s: %w", schema, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("evals: dropping schema %s: %w", schema, err)
	}
	return nil
}

// PostgresAvailable returns nil when dsn answers a connection within two seconds, and the
// connection error otherwise.
func PostgresAvailable(ctx context.Context, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}
