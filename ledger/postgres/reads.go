package postgres

import (
	"context"
	"errors"
	"fmt"
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

// listSQL pages one namespace by key: $1 namespace, $2 cursor (exclusive), $3 task,
// $4 operation, $5 target (an empty string matches all), $6 effective states (empty matches all),
// $7 limit, $8 offset µs.
var listSQL = `SELECT ` + cols("r") + `, c.now FROM toolfence_residuals r, (SELECT ` + now(8) + ` AS now) c
WHERE r.namespace = $1 AND r.key > $2 AND r.state <> '` + collected + `'
	AND ($3 = '' OR r.task = $3) AND ($4 = '' OR r.operation = $4) AND ($5 = '' OR r.target = $5)
	AND (cardinality($6::text[]) = 0 OR ` + effectiveSQL + ` = ANY($6::text[]))
ORDER BY r.key LIMIT $7`

// List implements ledger.Ledger: keyset pagination by key in one statement, filtering on
// the effective state at the server's clock. NextCursor is the last key of a full page.
func (l *Ledger) List(ctx context.Context, p ledger.ListParams) (*ledger.Page, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	states := make([]string, 0, len(p.States))
	for _, s := range p.States {
		states = append(states, string(s))
	}
	limit := rules.PageLimit(p.Limit)
	var page *ledger.Page
	_, err := l.retry(ctx, false, func(ctx context.Context, c *pgxpool.Conn, _ bool) error {
		rows, err := c.Query(ctx, listSQL, p.Namespace, p.Cursor, p.Task, p.Operation, p.Target, states, limit+1, l.offset.Load())
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
