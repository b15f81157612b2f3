package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DownOptions configure MigrateDown.
type DownOptions struct {
	Options
	// DropOpen is the number of open residuals (pending, unknown or accepted, in every
	// namespace) the caller confirms dropping when reverting to version 0, which drops
	// them with every other residual. With any other number open, MigrateDown refuses
	// with an *OpenResidualsError and changes nothing. Defaults to 0: only a store with
	// no open residual is dropped. Reverting to a version above 0 keeps every residual
	// and ignores DropOpen.
	DropOpen int
}

// ErrOpenResiduals is wrapped by MigrateDown's error when reverting to version 0 would
// drop open residuals that DownOptions.DropOpen does not confirm: nothing was changed.
var ErrOpenResiduals = errors.New("postgres: the store holds open residuals")

// OpenResidual names one open residual in an *OpenResidualsError.
type OpenResidual struct {
	Namespace, Key, State string
}

// OpenResidualsError is MigrateDown's refusal to drop open residuals: how many are open
// (counted under a lock that keeps writers out until the migration ends) and the oldest
// few, with the number DropOpen confirmed. It wraps ErrOpenResiduals.
type OpenResidualsError struct {
	// Store names the store (never its password).
	Store string
	// Count is the number of open residuals; First the oldest of them, at most
	// MaxListedOpen.
	Count int
	First []OpenResidual
	// Confirmed is DownOptions.DropOpen.
	Confirmed int
}

// MaxListedOpen is how many open residuals an OpenResidualsError names.
const MaxListedOpen = 5

func (e *OpenResidualsError) Error() string {
	if e.Count == 0 {
		return fmt.Sprintf("postgres: migrate %s down to 0: %d open residuals confirmed, but none is open now; nothing was changed", e.Store, e.Confirmed)
	}
	msg := fmt.Sprintf("postgres: migrate %s down to 0: %s would be dropped (%s); nothing was changed",
		e.Store, plural(e.Count, "open residual"), e.List())
	if e.Confirmed != 0 {
		msg += fmt.Sprintf(" (%d confirmed, but %d are open now)", e.Confirmed, e.Count)
	}
	return msg
}

// List names the listed residuals and how many more there are: "unknown tf1_… in
// namespace default, …, and 3 more".
func (e *OpenResidualsError) List() string {
	parts := make([]string, 0, len(e.First)+1)
	for _, r := range e.First {
		parts = append(parts, r.State+" "+r.Key+" in namespace "+r.Namespace)
	}
	if more := e.Count - len(e.First); more > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", more))
	}
	return strings.Join(parts, ", ")
}

func (e *OpenResidualsError) Is(target error) bool { return target == ErrOpenResiduals }

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// checkOpenBeforeDrop runs in the transaction that reverts to version 0, before any down
// SQL: it locks the residuals against writers (until the transaction ends, so nothing can
// be reserved between the count and the drop), counts the open ones and refuses unless
// their number is dropOpen. A schema without the residuals table has none.
func checkOpenBeforeDrop(ctx context.Context, tx pgx.Tx, where string, dropOpen int) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('toolfence_residuals') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("postgres: migrate %s: %w", where, err)
	}
	if !exists {
		return nil
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE toolfence_residuals IN EXCLUSIVE MODE`); err != nil {
		return fmt.Errorf("postgres: migrate %s: lock the residuals: %w", where, err)
	}
	const open = `state IN ('pending', 'unknown', 'accepted')`
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM toolfence_residuals WHERE `+open).Scan(&n); err != nil {
		return fmt.Errorf("postgres: migrate %s: count open residuals: %w", where, err)
	}
	if n == dropOpen {
		return nil
	}
	rows, err := tx.Query(ctx, `SELECT namespace, key, state FROM toolfence_residuals WHERE `+open+
		` ORDER BY created_at, namespace, key LIMIT $1`, MaxListedOpen)
	if err != nil {
		return fmt.Errorf("postgres: migrate %s: list open residuals: %w", where, err)
	}
	first, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (OpenResidual, error) {
		var r OpenResidual
		return r, row.Scan(&r.Namespace, &r.Key, &r.State)
	})
	if err != nil {
		return fmt.Errorf("postgres: migrate %s: list open residuals: %w", where, err)
	}
	return &OpenResidualsError{Store: where, Count: n, First: first, Confirmed: dropOpen}
}
