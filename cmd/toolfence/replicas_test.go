package main

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/fixture/pgcluster"
	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger/postgres"
)

// TestAsyncReplicasNeedTheFlag: a command that opens a PostgreSQL store whose only standby
// is asynchronous fails and names --allow-async-replicas; with it, it runs and warns.
func TestAsyncReplicasNeedTheFlag(t *testing.T) {
	testkit.SkipShort(t, "starts two PostgreSQL clusters")
	ctx := context.Background()
	primary, err := pgcluster.Start(ctx, pgcluster.Options{})
	require.NoError(t, err)
	t.Cleanup(primary.Stop)
	standby, err := primary.Standby(ctx, "", "cli_standby", pgcluster.Options{})
	require.NoError(t, err)
	t.Cleanup(standby.Stop)
	conn, err := pgx.Connect(ctx, primary.DSN("", ""))
	require.NoError(t, err)
	defer conn.Close(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for n := 0; n == 0; {
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&n))
		require.True(t, time.Now().Before(deadline), "the standby never streamed")
		if n == 0 {
			time.Sleep(50 * time.Millisecond) // the server's view; no event to wait on
		}
	}
	store := primary.DSN("", "") + "&search_path=tf_cli"
	l, err := postgres.Open(ctx, primary.DSN("", ""), postgres.Options{Schema: "tf_cli", AllowAsyncReplicas: true, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, l.Close())

	var out, errOut bytes.Buffer
	code := run(ctx, []string{"ls", "--store", store}, &out, &errOut)
	require.Equal(t, exitError, code, "stderr: %s", errOut.String())
	require.Contains(t, errOut.String(), "none is synchronous")
	require.Contains(t, errOut.String(), "--allow-async-replicas allows it")

	out.Reset()
	errOut.Reset()
	code = run(ctx, []string{"ls", "--store", store, "--allow-async-replicas"}, &out, &errOut)
	require.Equal(t, exitOK, code, "stderr: %s", errOut.String())
	require.Contains(t, errOut.String(), "level=WARN")
	require.Contains(t, errOut.String(), "asynchronous standbys only")
}
