package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/rules"
	"github.com/toolfence/toolfence/residual"
)

// Get implements ledger.Ledger: one statement reads the residual and the server's clock, and
// the residual comes back with its effective state.
func (l *Ledger) Get(ctx context.Context, p ledger.GetParams) (*residual.Residual, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var out *residual.Residual
	var missing error
	_, err := l.retry(ctx, false, func(ctx context.Context, c *pgxpool.Conn, _ bool) error {
		var clock time.Time
		r, _, err := scanRow(c.QueryRow(ctx, getSQL, p.Namespace, p.Key, l.offset.Load()), &clock)
		if errors.Is(err, pgx.ErrNoRows) {
			missing = fmt.Errorf("%w: key %s in namespace %q", residual.ErrNotFound, p.Key, p.Namespace)
			return nil
		}
		if err != nil {
			return err
		}
		r.State = r.EffectiveState(clock.UTC())
		out, missing = r, nil
		return nil
	})
	if err != nil {
		return nil, l.fail("get of key "+p.Key, false, err)
	}
	return out, missing
}

// effectiveSQL is the effective state of row r at c.now, as residual.EffectiveState.
const effectiveSQL = `CASE WHEN r.state = 'pending' AND NOT (r.att_outcome = '' AND NOT r.att_released
	AND r.att_lease_expires > c.now) THEN 'unknown' ELSE r.state END`

// listQuery returns the statement that pages one namespace by key with p's filters, and its
// arguments. Only the filters p sets appear in it, so each shape of filter has its own
// prepared statement whose plan can use the index of what it filters on (migration 0007): a
// task, operation or target is an equality on (field, namespace, key); states that are all
// open read the partial index of the open residuals. States filter on the effective state at
// the server's clock: the stored states that can read as them narrow the rows first.
func listQuery(p ledger.ListParams, limit int, offset int64) (string, []any) {
	args := []any{p.Namespace, p.Cursor, limit + 1, offset}
	var b strings.Builder
	b.WriteString(`SELECT ` + cols("r") + `, c.now FROM toolfence_residuals r, (SELECT ` + now(4) + ` AS now) c
WHERE r.namespace = $1 AND r.key > $2`)
	for _, f := range []struct{ col, v string }{{"task", p.Task}, {"operation", p.Operation}, {"target", p.Target}} {
		if f.v != "" {
			args = append(args, f.v)
			fmt.Fprintf(&b, " AND r.%s = $%d", f.col, len(args))
		}
	}
	if len(p.States) == 0 {
		b.WriteString(` AND r.state <> '` + collected + `'`)
	} else {
		// Literal state names (validated, from a fixed set), so the planner can prove that
		// open states imply the predicate of the open index.
		b.WriteString(" AND r.state IN (")
		for i, s := range storedStates(p.States) {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("'" + string(s) + "'")
		}
		b.WriteString(")")
		// With every open state asked for, each stored state above reads as one that is
		// asked for (a stored pending reads as pending or unknown): the effective state
		// needs no check, and without one the planner estimates the open rows from the
		// index alone, so it reads the open index in key order and stops at the page.
		if !allOpen(p.States) {
			b.WriteString(" AND " + effectiveIn(p.States))
		}
	}
	b.WriteString(" ORDER BY r.key LIMIT $3")
	return b.String(), args
}

// effectiveIn is the SQL condition that the effective state of row r at c.now is one of
// want, as residual.EffectiveState and effectiveSQL decide it (a pending residual whose
// attempt is over or whose lease ran out reads as unknown), written as conditions on the
// columns rather than one CASE expression, so that the planner estimates how many rows
// qualify from the columns' statistics (it cannot for a CASE, and guessing few, it would
// rather scan and sort than read an index in key order up to the page).
func effectiveIn(want []residual.State) string {
	const live = `(r.att_outcome = '' AND NOT r.att_released AND r.att_lease_expires > c.now)`
	var terms []string
	switch p, u := slices.Contains(want, residual.Pending), slices.Contains(want, residual.Unknown); {
	case p && u:
		terms = append(terms, `r.state = 'pending'`)
	case p:
		terms = append(terms, `(r.state = 'pending' AND `+live+`)`)
	case u:
		terms = append(terms, `(r.state = 'pending' AND NOT `+live+`)`)
	}
	for _, s := range residual.States {
		if s != residual.Pending && slices.Contains(want, s) {
			terms = append(terms, `r.state = '`+string(s)+`'`)
		}
	}
	return "(" + strings.Join(terms, " OR ") + ")"
}

// allOpen reports whether states holds every open state (pending, unknown, accepted).
func allOpen(states []residual.State) bool {
	return slices.Contains(states, residual.Pending) && slices.Contains(states, residual.Unknown) &&
		slices.Contains(states, residual.Accepted)
}

// storedStates returns the stored states whose rows can have one of the effective states
// want, in the order of residual.States: an expired pending reads as unknown.
func storedStates(want []residual.State) []residual.State {
	var out []residual.State
	for _, s := range residual.States {
		for _, w := range want {
			if s == w || s == residual.Pending && w == residual.Unknown {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// List implements ledger.Ledger: keyset pagination by key in one statement (listQuery),
// filtering on the effective state at the server's clock. It reads one row past the page to
// tell whether more remain: NextCursor is the last key of a page that has more after it.
func (l *Ledger) List(ctx context.Context, p ledger.ListParams) (*ledger.Page, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	limit := rules.PageLimit(p.Limit)
	var page *ledger.Page
	_, err := l.retry(ctx, false, func(ctx context.Context, c *pgxpool.Conn, _ bool) error {
		sql, args := listQuery(p, limit, l.offset.Load())
		rows, err := c.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		page = &ledger.Page{}
		for rows.Next() {
			var clock time.Time
			r, _, err := scanRow(rows, &clock)
			if err != nil {
				return err
			}
			r.State = r.EffectiveState(clock.UTC())
			page.Residuals = append(page.Residuals, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, l.fail(fmt.Sprintf("list of namespace %q", p.Namespace), false, err)
	}
	if len(page.Residuals) > limit {
		page.Residuals = page.Residuals[:limit]
		page.NextCursor = page.Residuals[limit-1].Key
	}
	return page, nil
}

// gcSQL replaces succeeded and failed residuals last updated before $2 ($1 namespace, an empty string
// for all) by tombstones: the key and its last token stay, everything else is cleared, so
// a key reserved again after GC gets a higher token than any it had.
var gcSQL = `UPDATE toolfence_residuals SET state = '` + collected + `', task = '', operation = '',
	target = '', request_digest = '', att_n = 0, att_holder = '', att_token = token,
	att_lease_expires = updated_at, att_started = updated_at, att_ended = NULL,
	att_request_digest = '', att_response_digest = '', att_outcome = '', att_error = '',
	att_released = false, att_reservation = '', prior_attempts = '[]', result = NULL,
	result_digest = '', result_truncated = false, handle = '', evidence = '[]',
	resolutions = '[]'
WHERE ($1 = '' OR namespace = $1) AND state IN ('succeeded', 'failed') AND updated_at < $2`

// GC implements ledger.Ledger in one statement: succeeded and failed residuals last updated
// before p.Before become tombstones (see gcSQL), which no read returns. Open residuals are
// never touched. Deleted counts the residuals collected.
func (l *Ledger) GC(ctx context.Context, p ledger.GCParams) (ledger.GCResult, error) {
	if err := l.check(); err != nil {
		return ledger.GCResult{}, err
	}
	if err := p.Validate(); err != nil {
		return ledger.GCResult{}, err
	}
	var deleted int64
	_, err := l.retry(ctx, true, func(ctx context.Context, c *pgxpool.Conn, _ bool) error {
		tag, err := c.Exec(ctx, gcSQL, p.Namespace, p.Before.UTC())
		deleted += tag.RowsAffected()
		return err
	})
	if err != nil {
		return ledger.GCResult{Deleted: int(deleted)}, l.fail(fmt.Sprintf("gc of namespace %q", p.Namespace), false, err)
	}
	return ledger.GCResult{Deleted: int(deleted)}, nil
}
