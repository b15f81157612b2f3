package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

var (
	_ ledger.OpenCounter = (*Ledger)(nil)
	_ ledger.Describer   = (*Ledger)(nil)
)

// Describe implements ledger.Describer: system "postgresql", the database and schema as
// the namespace, the residuals table as the collection.
func (l *Ledger) Describe() ledger.Description {
	return ledger.Description{System: "postgresql", Namespace: l.conn.Database + "|" + l.schema, Collection: "toolfence_residuals", Remote: true}
}

// openSQL counts open residuals by effective state through the partial index of the open
// residuals (namespace, key) of migration 0005, which reads the open rows only, never the
// settled ones ($1: offset µs).
var openSQL = `SELECT s, count(*), min(att_started) FROM (
	SELECT ` + effectiveSQL + ` AS s, r.att_started FROM toolfence_residuals r, (SELECT ` + now(1) + ` AS now) c
	WHERE r.state IN ('pending', 'unknown', 'accepted')) o
GROUP BY s`

// OpenResiduals implements ledger.OpenCounter with one statement over the partial index of
// open residuals (migration 0005), at the server's clock.
func (l *Ledger) OpenResiduals(ctx context.Context) ([]ledger.OpenCount, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	out := []ledger.OpenCount{{State: residual.Pending}, {State: residual.Unknown}, {State: residual.Accepted}}
	_, err := l.retry(ctx, false, func(ctx context.Context, c *pgxpool.Conn, _ bool) error {
		for i := range out {
			out[i].Count, out[i].Oldest = 0, time.Time{}
		}
		rows, err := c.Query(ctx, openSQL, l.offset.Load())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s string
			var n int64
			var oldest time.Time
			if err := rows.Scan(&s, &n, &oldest); err != nil {
				return err
			}
			for i := range out {
				if string(out[i].State) == s {
					out[i].Count, out[i].Oldest = n, oldest.UTC()
				}
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, l.fail("count of open residuals", false, err)
	}
	return out, nil
}
