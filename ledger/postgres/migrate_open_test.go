package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// TestMigrateDownRefusesOpenResiduals: reverting to 0 drops every residual, so with open
// ones (calls that may have happened) it is refused, naming how many and the oldest five,
// unless DropOpen is exactly their number; a wrong number is refused too. Settled
// residuals do not count. Nothing changes until the count matches.
func TestMigrateDownRefusesOpenResiduals(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	ctx := context.Background()
	l := open(t, schema, postgres.Options{})
	var keys []string
	for i := range 7 {
		p := params(fmt.Sprint("open-", i), "h")
		res, err := l.Reserve(ctx, p)
		require.NoError(t, err)
		if i == 6 {
			_, err = l.Commit(ctx, commitOf(p, res, residual.Succeeded))
			require.NoError(t, err)
			continue
		}
		keys = append(keys, p.Key)
	}
	admin := adminConn(t, schema)
	before := tables(t, admin, schema)
	opts := postgres.DownOptions{Options: postgres.Options{Schema: schema}}

	_, _, err := postgres.MigrateDown(ctx, testDSN(), 0, opts)
	require.ErrorIs(t, err, postgres.ErrOpenResiduals)
	var oe *postgres.OpenResidualsError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, 6, oe.Count)
	require.Len(t, oe.First, postgres.MaxListedOpen)
	for i, r := range oe.First {
		require.Equal(t, postgres.OpenResidual{Namespace: "test", Key: keys[i], State: "pending"}, r, "oldest first")
	}
	require.ErrorContains(t, err, "6 open residuals would be dropped (pending "+keys[0]+" in namespace test, ")
	require.ErrorContains(t, err, ", and 1 more); nothing was changed")
	require.Equal(t, before, tables(t, admin, schema))

	opts.DropOpen = 5
	_, _, err = postgres.MigrateDown(ctx, testDSN(), 0, opts)
	require.ErrorAs(t, err, &oe)
	require.ErrorContains(t, err, "(5 confirmed, but 6 are open now)")
	require.Equal(t, before, tables(t, admin, schema))

	// A revert that keeps the residuals needs no confirmation.
	from, to, err := postgres.MigrateDown(ctx, testDSN(), 1, postgres.DownOptions{Options: opts.Options})
	require.NoError(t, err)
	require.Equal(t, [2]int{postgres.LatestVersion(), 1}, [2]int{from, to})

	opts.DropOpen = 6
	_, to, err = postgres.MigrateDown(ctx, testDSN(), 0, opts)
	require.NoError(t, err)
	require.Zero(t, to)
	require.Empty(t, tables(t, admin, schema))
}
