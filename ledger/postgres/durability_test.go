package postgres_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/fixture/pgcluster"
	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// throwaway starts a PostgreSQL cluster of the test's own (the shared server is never
// reconfigured or crashed), stopped and removed when the test ends.
func throwaway(t *testing.T, settings ...string) *pgcluster.Cluster {
	t.Helper()
	testkit.SkipShort(t, "starts a PostgreSQL cluster")
	c, err := pgcluster.Start(context.Background(), pgcluster.Options{Settings: settings})
	if err != nil && os.Getenv("CI") != "true" && os.Getenv("TOOLFENCE_SKIP_PG") == "1" {
		t.Skip(err)
	}
	require.NoError(t, err)
	t.Cleanup(c.Stop)
	return c
}

// execAll runs each statement on a fresh connection to dsn.
func execAll(t *testing.T, dsn string, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, s := range stmts {
		_, err := conn.Exec(ctx, s)
		require.NoError(t, err, s)
	}
}

// TestCrashWithSynchronousCommitOffLosesNothing: the database runs with synchronous_commit
// = off and a WAL writer that waits 10 s, so a commit that is not flushed by the session
// itself stays in memory. Every reservation and commit the ledger acknowledged must survive
// an immediate shutdown, and no fencing token may be issued twice after the restart.
func TestCrashWithSynchronousCommitOffLosesNothing(t *testing.T) {
	c := throwaway(t, "wal_writer_delay=10s")
	ctx := context.Background()
	dsn := c.DSN("", "")
	// The store is created under the server's defaults; only its use runs with the
	// lossy setting.
	l, err := postgres.Open(ctx, dsn, postgres.Options{})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	execAll(t, dsn, `ALTER DATABASE postgres SET synchronous_commit = off`, `CHECKPOINT`)

	l, err = postgres.Open(ctx, dsn, postgres.Options{})
	require.NoError(t, err)
	const n = 200
	type acked struct {
		p         ledger.ReserveParams
		token     uint64
		committed bool
	}
	var calls []acked
	for i := range n {
		p := params(fmt.Sprintf("crash-%d", i), "holder-a")
		p.TTL = time.Hour
		res, err := l.Reserve(ctx, p)
		require.NoError(t, err)
		require.Equal(t, ledger.Acquired, res.Decision)
		a := acked{p: p, token: res.Lease.Token}
		if i%2 == 0 {
			_, err := l.Commit(ctx, commitOf(p, res, residual.Succeeded))
			require.NoError(t, err)
			a.committed = true
		}
		calls = append(calls, a)
	}
	// The crash comes first: closing the pool's sessions must not get a chance to flush.
	require.NoError(t, c.Ctl(ctx, "stop"))
	_ = l.Close()
	require.NoError(t, c.Ctl(ctx, "start"))

	l, err = postgres.Open(ctx, dsn, postgres.Options{})
	require.NoError(t, err)
	defer l.Close()
	var lostReserves, lostCommits, reissued int
	for _, a := range calls {
		r, err := l.Get(ctx, ledger.GetParams{Namespace: a.p.Namespace, Key: a.p.Key})
		switch {
		case err != nil || r.Token < a.token:
			lostReserves++
		case a.committed && r.State != residual.Succeeded:
			lostCommits++
		}
		// A successor: it must be refused (in progress) or replayed, never handed a token
		// that was already acknowledged to holder-a.
		q := a.p
		q.Holder = "holder-b"
		res, err := l.Reserve(ctx, q)
		require.NoError(t, err)
		if res.Decision == ledger.Acquired && res.Lease.Token <= a.token {
			reissued++
		}
	}
	t.Logf("of %d acknowledged reservations (%d committed): %d reservations lost, %d more commits lost, %d tokens issued twice",
		n, (n+1)/2, lostReserves, lostCommits, reissued)
	require.Zero(t, lostReserves+lostCommits+reissued, "acknowledged writes were lost in the crash")
}

// syncCommitOf returns synchronous_commit on each of n connections of l's pool, held at
// once so that they are n distinct sessions.
func syncCommitOf(t *testing.T, l *postgres.Ledger, n int) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	for range n {
		c, err := l.Pool().Acquire(ctx)
		require.NoError(t, err)
		defer c.Release()
		var v string
		require.NoError(t, c.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&v))
		out = append(out, v)
	}
	return out
}

// TestSessionsRaiseSynchronousCommit: whether the database, the role or the DSN lowers
// synchronous_commit, every connection of the ledger runs with on; remote_apply is kept.
func TestSessionsRaiseSynchronousCommit(t *testing.T) {
	c := throwaway(t)
	execAll(t, c.DSN("", ""),
		`ALTER DATABASE postgres SET synchronous_commit = off`,
		`CREATE ROLE tf_remote_write LOGIN`, `GRANT CREATE ON DATABASE postgres TO tf_remote_write`,
		`ALTER ROLE tf_remote_write SET synchronous_commit = remote_write`,
		`CREATE ROLE tf_remote_apply LOGIN`, `GRANT CREATE ON DATABASE postgres TO tf_remote_apply`,
		`ALTER ROLE tf_remote_apply IN DATABASE postgres SET synchronous_commit = remote_apply`)
	at := func(user, query string) string {
		return fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable%s", user, c.Addr(), query)
	}
	for i, tc := range []struct{ name, dsn, want string }{
		{"database off", at("postgres", ""), "on"},
		{"role remote_write", at("tf_remote_write", ""), "on"},
		{"dsn options local", at("postgres", "&options=-c%20synchronous_commit%3Dlocal"), "on"},
		{"role remote_apply kept", at("tf_remote_apply", ""), "remote_apply"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := postgres.Open(context.Background(), tc.dsn, postgres.Options{MaxConns: 4, Schema: fmt.Sprintf("tf_%d", i)})
			require.NoError(t, err)
			defer l.Close()
			require.Equal(t, []string{tc.want, tc.want, tc.want, tc.want}, syncCommitOf(t, l, 4))
			require.Equal(t, tc.want, l.Replication().SynchronousCommit)
			_, err = l.Pool().Exec(context.Background(), postgres.BarrierSQL)
			require.NoError(t, err, "every role may run the barrier of a retried write")
		})
	}
}

// TestOpenRefusesServerThatLosesCommits: fsync = off and full_page_writes = off cannot be
// repaired by a session; Open names them, wraps ErrNotDurable and creates nothing.
func TestOpenRefusesServerThatLosesCommits(t *testing.T) {
	c := throwaway(t)
	ctx := context.Background()
	require.NoError(t, c.Restart(ctx, "fsync=off", "full_page_writes=off"))
	_, err := postgres.Open(ctx, c.DSN("", ""), postgres.Options{Schema: "tf_refused"})
	require.ErrorIs(t, err, postgres.ErrNotDurable)
	require.ErrorContains(t, err, "fsync = off")
	require.ErrorContains(t, err, "full_page_writes = off")
	conn, err := pgx.Connect(ctx, c.DSN("", ""))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'tf_refused'`).Scan(&n))
	require.Zero(t, n, "a refused server gets nothing written")
}

// waitSyncState waits until the primary at dsn lists a standby with sync_state want.
func waitSyncState(t *testing.T, dsn, want string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = $1`, want).Scan(&n))
		if n > 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "no standby became %s", want)
		time.Sleep(50 * time.Millisecond) // polling the server's view; there is no event to wait on
	}
}

// TestOpenRefusesAsynchronousStandbys: a primary whose only standby is asynchronous is
// refused (ErrAsyncReplicas) unless AllowAsyncReplicas is set, which opens it with a
// warning; once the standby is synchronous, Open needs nothing.
func TestOpenRefusesAsynchronousStandbys(t *testing.T) {
	primary := throwaway(t)
	ctx := context.Background()
	standby, err := primary.Standby(ctx, "", "tf_standby", pgcluster.Options{})
	require.NoError(t, err)
	t.Cleanup(standby.Stop)
	dsn := primary.DSN("", "")
	waitSyncState(t, dsn, "async")

	_, err = postgres.Open(ctx, dsn, postgres.Options{})
	require.ErrorIs(t, err, postgres.ErrAsyncReplicas)
	require.ErrorContains(t, err, "1 standby(s) and none is synchronous")
	require.ErrorContains(t, err, "AllowAsyncReplicas")

	var logged bytes.Buffer
	l, err := postgres.Open(ctx, dsn, postgres.Options{AllowAsyncReplicas: true, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	require.NoError(t, err)
	require.Equal(t, postgres.Replication{Standbys: 1, SynchronousCommit: "on"}, l.Replication())
	require.True(t, l.Replication().Async())
	n, err := l.AsyncReplicas(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the metrics gauge reads the standbys again")
	require.NoError(t, l.Close())
	require.Contains(t, logged.String(), "level=WARN")
	require.Contains(t, logged.String(), "asynchronous standbys only")

	execAll(t, dsn, `ALTER SYSTEM SET synchronous_standby_names = '*'`, `SELECT pg_reload_conf()`)
	waitSyncState(t, dsn, "sync")
	l, err = postgres.Open(ctx, dsn, postgres.Options{})
	require.NoError(t, err)
	defer l.Close()
	require.Equal(t, postgres.Replication{Standbys: 1, Synchronous: 1, StandbyNames: "*", SynchronousCommit: "on"}, l.Replication())
	n, err = l.AsyncReplicas(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	p := params("replicated", "holder-a")
	res, err := l.Reserve(ctx, p)
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, res.Decision)
}

// TestTerminatedSyncWaitIsNotAcknowledged: a commit waiting for its synchronous standby
// that is terminated has committed locally (PostgreSQL says so, and other sessions see it)
// but not on the standby. The ledger's re-read after the broken connection finds the
// write; it must not acknowledge it before the standby has it too, or a failover loses an
// acknowledged reservation.
func TestTerminatedSyncWaitIsNotAcknowledged(t *testing.T) {
	primary := throwaway(t)
	ctx := context.Background()
	standby, err := primary.Standby(ctx, "", "tf_standby", pgcluster.Options{})
	require.NoError(t, err)
	t.Cleanup(standby.Stop)
	dsn := primary.DSN("", "")
	execAll(t, dsn, `ALTER SYSTEM SET synchronous_standby_names = '*'`, `SELECT pg_reload_conf()`)
	waitSyncState(t, dsn, "sync")
	l, err := postgres.Open(ctx, dsn, postgres.Options{WriteTimeout: 3 * time.Second})
	require.NoError(t, err)
	defer l.Close()

	require.NoError(t, standby.Ctl(ctx, "stop")) // commits now wait for a standby
	type result struct {
		res *ledger.ReserveResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := l.Reserve(ctx, params("sync-wait", "holder-a"))
		done <- result{res, err}
	}()
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer admin.Close(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = 'toolfence' AND wait_event = 'SyncRep'`).Scan(&n))
		if n > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the reservation never waited for the standby")
		time.Sleep(20 * time.Millisecond) // the server's view; no event to wait on
	}
	r := <-done
	if r.err == nil {
		t.Fatalf("a reservation the standby never received was acknowledged: %v token %d", r.res.Decision, r.res.Lease.Token)
	}
	require.ErrorIs(t, r.err, ledger.ErrOutcomeUnknown)
}
