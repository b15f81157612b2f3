package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/ledgertest"
	"github.com/toolfence/toolfence/ledger/postgres"
)

// TestConformance runs the whole ledgertest suite against PostgreSQL, each case in its own
// schema, once with change notifications inside each write's transaction (the default)
// and once after each commit. Advance shifts the offset the ledger adds to the server's
// clock.
func TestConformance(t *testing.T) {
	requireServer(t)
	for _, afterCommit := range []bool{false, true} {
		name := map[bool]string{false: "notify-in-tx", true: "notify-after-commit"}[afterCommit]
		t.Run(name, func(t *testing.T) { conformance(t, postgres.Options{MaxConns: 8, NotifyAfterCommit: afterCommit}) })
	}
}

func conformance(t *testing.T, opts postgres.Options) {
	ledgertest.Run(t, ledgertest.Harness{
		TimePrecision: time.Microsecond,
		Open: func(t *testing.T) ledgertest.Fixture {
			schema := newSchema(t)
			var mu sync.Mutex
			cur := open(t, schema, opts)
			admin := adminConn(t, schema) // reads the server clock even after the suite closed the ledger
			get := func() *postgres.Ledger {
				mu.Lock()
				defer mu.Unlock()
				return cur
			}
			return ledgertest.Fixture{
				Ledger: cur,
				Advance: func(t *testing.T, d time.Duration) {
					l := get()
					l.SetTimeOffset(l.TimeOffset() + d)
				},
				Now: func(t *testing.T) time.Time {
					mu.Lock()
					defer mu.Unlock()
					var now time.Time
					err := admin.QueryRow(context.Background(), `SELECT clock_timestamp() + $1::bigint * interval '1 microsecond'`,
						cur.TimeOffset().Microseconds()).Scan(&now)
					require.NoError(t, err)
					return now.UTC()
				},
				Reopen: func(t *testing.T) ledger.Ledger {
					old := get()
					require.NoError(t, old.Close())
					reopened := opts
					reopened.TimeOffset = old.TimeOffset()
					l := open(t, schema, reopened)
					mu.Lock()
					cur = l
					mu.Unlock()
					return l
				},
			}
		},
	})
}
