package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/ledger/postgres"
)

// isDSN reports whether store names a PostgreSQL database rather than a badger directory.
func isDSN(store string) bool {
	return strings.HasPrefix(store, "postgres://") || strings.HasPrefix(store, "postgresql://")
}

// openStore opens the ledger named by store: PostgreSQL for a postgres:// or postgresql://
// DSN, otherwise the badger directory store (created when missing). It is the one place the
// binary opens ledgers. A badger directory held by another process gives an error that says
// so (and wraps badger.ErrLocked).
func openStore(ctx context.Context, store string) (ledger.Ledger, error) {
	if store == "" {
		return nil, usagef("--store is empty: name a badger directory or a postgres:// DSN")
	}
	if isDSN(store) {
		return openPostgres(ctx, store)
	}
	l, err := badger.Open(store, badger.Options{})
	if errors.Is(err, badger.ErrLocked) {
		return nil, &lockedError{store: store, err: err}
	}
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", store, err)
	}
	return l, nil
}

// openPostgres opens the PostgreSQL ledger at dsn, applying pending migrations. Its
// errors name the server, never the password.
func openPostgres(ctx context.Context, dsn string) (ledger.Ledger, error) {
	l, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", displayStore(dsn), err)
	}
	return l, nil
}

// lockedError says that another process holds a badger store; it wraps badger.ErrLocked.
type lockedError struct {
	store string
	err   error
}

func (e *lockedError) Error() string {
	return "store " + e.store + " is in use by another process (is `toolfence serve` running? use --server URL)"
}

func (e *lockedError) Unwrap() error { return e.err }
