package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// faultEnv is a ledger with a single pooled connection (so "the worker's connection" is
// one backend), an admin connection, and an executions table that records the tool's
// effect outside the ledger.
type faultEnv struct {
	t      *testing.T
	l      *postgres.Ledger
	admin  *pgx.Conn
	app    string // application_name of the ledger's connections
	schema string
}

func newFaultEnv(t *testing.T, dsn func(url.Values) string) *faultEnv {
	t.Helper()
	schema := newSchema(t)
	app := "tf-fault-" + strings.ToLower(rand.Text()[:10])
	l, err := postgres.Open(context.Background(), dsn(url.Values{"application_name": {app}}),
		postgres.Options{Schema: schema, MaxConns: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	admin := adminConn(t, schema)
	_, err = admin.Exec(context.Background(), `CREATE TABLE executions (key text NOT NULL)`)
	require.NoError(t, err)
	return &faultEnv{t: t, l: l, admin: admin, app: app, schema: schema}
}

// withParams adds query parameters to the test DSN.
// lockRow holds the row of key in schema under FOR UPDATE in an open transaction of its own
// connection, so that a write on it waits; the caller rolls the transaction back.
func lockRow(t *testing.T, schema, key string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := adminConn(t, schema).Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM toolfence_residuals WHERE namespace = $1 AND key = $2 FOR UPDATE`, ns, key)
	require.NoError(t, err)
	return tx
}

func withParams(v url.Values) string {
	u, err := url.Parse(testDSN())
	if err != nil {
		panic("the fault tests need TOOLFENCE_TEST_PG as a postgres:// URL: " + err.Error())
	}
	q := u.Query()
	for k, vs := range v {
		q[k] = vs
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// acquireAndExecute reserves p, requires Acquired and performs the tool's effect.
func (f *faultEnv) acquireAndExecute(p ledger.ReserveParams) *ledger.ReserveResult {
	f.t.Helper()
	res, err := f.l.Reserve(context.Background(), p)
	require.NoError(f.t, err)
	require.Equal(f.t, ledger.Acquired, res.Decision)
	_, err = f.admin.Exec(context.Background(), `INSERT INTO executions (key) VALUES ($1)`, p.Key)
	require.NoError(f.t, err)
	return res
}

// lockedWorkerPID waits until the ledger's backend waits on a lock (its statement is in
// flight) and returns its pid.
func (f *faultEnv) lockedWorkerPID(admin *pgx.Conn) int32 {
	f.t.Helper()
	var pid int32
	require.Eventually(f.t, func() bool {
		return admin.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, f.app).Scan(&pid) == nil
	}, 20*time.Second, 5*time.Millisecond, "the worker's statement never waited on the lock")
	return pid
}

// terminate kills backend pid and waits until it is gone.
func terminate(t *testing.T, admin *pgx.Conn, pid int32) {
	t.Helper()
	var ok bool
	require.NoError(t, admin.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pid).Scan(&ok))
	require.True(t, ok)
	require.Eventually(t, func() bool {
		var n int
		return admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n) == nil && n == 0
	}, 20*time.Second, 5*time.Millisecond)
}

// requireSettledOnce checks the end state: the effect happened exactly once, and a new
// Reserve of the call never acquires (it replays, or is blocked as unknown or in progress).
func (f *faultEnv) requireNoSecondDispatch(p ledger.ReserveParams) ledger.Decision {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.admin.QueryRow(context.Background(), `SELECT count(*) FROM executions WHERE key = $1`, p.Key).Scan(&n))
	require.Equal(f.t, 1, n, "the effect happened once")
	again := p
	again.Holder = "successor"
	res, err := f.l.Reserve(context.Background(), again)
	require.NoError(f.t, err)
	require.NotEqual(f.t, ledger.Acquired, res.Decision, "a call whose effect happened is never dispatched again")
	return res.Decision
}

// The worker's connection is killed while idle between reserve and commit: the commit
// lands on a new connection under the fence.
func TestFaultTerminateBetweenReserveAndCommit(t *testing.T) {
	t.Parallel()
	f := newFaultEnv(t, withParams)
	p := params("charge:between", "worker")
	res := f.acquireAndExecute(p)
	var pid int32 // the pool's only connection
	require.NoError(t, f.l.Pool().QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid))
	terminate(t, f.admin, pid)

	r, err := f.l.Commit(context.Background(), commitOf(p, res, residual.Succeeded))
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, r.State)
	require.Empty(t, r.Evidence)
	require.Equal(t, ledger.Replay, f.requireNoSecondDispatch(p))
}

// The worker's backend is killed while its commit waits on a row lock (the commit is in
// flight): the ledger re-reads under the lock on a new connection, finds the fence still
// holding and commits there once.
func TestFaultTerminateDuringCommit(t *testing.T) {
	t.Parallel()
	f := newFaultEnv(t, withParams)
	ctx := context.Background()
	p := params("charge:during", "worker")
	res := f.acquireAndExecute(p)

	tx := lockRow(t, f.schema, p.Key)

	type result struct {
		r   *residual.Residual
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := f.l.Commit(ctx, commitOf(p, res, residual.Succeeded))
		done <- result{r, err}
	}()
	terminate(t, f.admin, f.lockedWorkerPID(f.admin)) // the commit statement is in flight
	require.NoError(t, tx.Rollback(ctx))

	out := <-done
	require.NoError(t, out.err)
	require.Equal(t, residual.Succeeded, out.r.State)
	require.Len(t, out.r.Attempts, 1)
	require.Equal(t, ledger.Replay, f.requireNoSecondDispatch(p))
}

// The server commits but its reply is lost with the connection: Commit reconnects, sees
// its own commit stored and reports it (no error, no evidence, no second write).
func TestFaultCommitReplyLost(t *testing.T) {
	t.Parallel()
	proxy := newFaultProxy(t)
	f := newFaultEnv(t, func(v url.Values) string {
		v.Set("default_query_exec_mode", "simple_protocol") // SQL text on the wire, to recognise the commit
		return proxy.dsn(v)
	})
	p := params("charge:lost-reply", "worker")
	res := f.acquireAndExecute(p)

	proxy.loseReplyTo("att_released = true")
	r, err := f.l.Commit(context.Background(), commitOf(p, res, residual.Succeeded))
	require.NoError(t, err)
	require.Equal(t, int32(1), proxy.cuts.Load(), "the commit's reply was lost")
	require.Equal(t, residual.Succeeded, r.State)
	require.Empty(t, r.Evidence, "the recovered commit is not mistaken for a late one")
	require.Equal(t, ledger.Replay, f.requireNoSecondDispatch(p))
}

// The reply is lost and the server stays unreachable: Commit says the outcome is unknown
// (not lease lost, not success). The commit had landed; once the server is back the call
// replays and is never dispatched again.
func TestFaultCommitOutcomeUnknownLanded(t *testing.T) {
	t.Parallel()
	proxy := newFaultProxy(t)
	f := newFaultEnv(t, func(v url.Values) string {
		v.Set("default_query_exec_mode", "simple_protocol")
		return proxy.dsn(v)
	})
	p := params("charge:unknown-landed", "worker")
	res := f.acquireAndExecute(p)

	proxy.setRefuse(true)
	proxy.loseReplyTo("att_released = true")
	_, err := f.l.Commit(context.Background(), commitOf(p, res, residual.Succeeded))
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
	require.NotErrorIs(t, err, residual.ErrLeaseLost)
	t.Log(err)

	proxy.setRefuse(false)
	require.Equal(t, ledger.Replay, f.requireNoSecondDispatch(p))
}

// The commit is killed in flight and the server stays unreachable: the outcome is unknown,
// the commit did not land, and the residual stays pending and then reads unknown: the
// call is blocked for reconciliation, never dispatched again.
func TestFaultCommitOutcomeUnknownNotLanded(t *testing.T) {
	t.Parallel()
	proxy := newFaultProxy(t)
	f := newFaultEnv(t, proxy.dsn)
	ctx := context.Background()
	p := params("charge:unknown-lost", "worker")
	p.TTL = 10 * time.Second
	res := f.acquireAndExecute(p)

	tx := lockRow(t, f.schema, p.Key)
	done := make(chan error, 1)
	go func() {
		_, err := f.l.Commit(ctx, commitOf(p, res, residual.Succeeded))
		done <- err
	}()
	pid := f.lockedWorkerPID(f.admin)
	proxy.setRefuse(true)
	terminate(t, f.admin, pid)
	require.NoError(t, tx.Rollback(ctx))
	err := <-done
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
	t.Log(err)

	proxy.setRefuse(false)
	require.Equal(t, ledger.InProgress, f.requireNoSecondDispatch(p), "the lease is still live")
	f.l.SetTimeOffset(p.TTL + time.Second)
	got, err := f.l.Get(ctx, ledger.GetParams{Namespace: ns, Key: p.Key})
	require.NoError(t, err)
	require.Equal(t, residual.Unknown, got.State)
	require.Equal(t, ledger.UnknownOutcome, f.requireNoSecondDispatch(p))
}

// The server inserts the reservation but the reply is lost: Reserve tries again under the
// same reservation id, recognises its own attempt and acquires it, instead of reporting
// its own key as in progress.
func TestFaultReserveReplyLost(t *testing.T) {
	t.Parallel()
	proxy := newFaultProxy(t)
	f := newFaultEnv(t, func(v url.Values) string {
		v.Set("default_query_exec_mode", "simple_protocol")
		return proxy.dsn(v)
	})
	ctx := context.Background()
	p := params("charge:reserve-lost", "worker")
	proxy.loseReplyTo("ON CONFLICT (namespace, key) DO NOTHING")
	res, err := f.l.Reserve(ctx, p)
	require.NoError(t, err)
	require.Equal(t, int32(1), proxy.cuts.Load())
	require.Equal(t, ledger.Acquired, res.Decision)
	require.Len(t, res.Residual.Attempts, 1)
	require.Equal(t, uint64(1), res.Lease.Token)

	other, err := f.l.Reserve(ctx, params("charge:reserve-lost", "other"))
	require.NoError(t, err)
	require.Equal(t, ledger.InProgress, other.Decision)
	r, err := f.l.Commit(ctx, commitOf(p, res, residual.Succeeded))
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, r.State)
}

// A caller that gives up while its commit is in flight does not make the write ambiguous:
// the commit finishes under the ledger's write timeout and is reported.
func TestCommitInFlightSurvivesCallerCancel(t *testing.T) {
	t.Parallel()
	f := newFaultEnv(t, withParams)
	p := params("charge:cancel", "worker")
	res := f.acquireAndExecute(p)

	ctx := context.Background()
	tx := lockRow(t, f.schema, p.Key)

	cctx, cancel := context.WithCancel(ctx)
	type result struct {
		r   *residual.Residual
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := f.l.Commit(cctx, commitOf(p, res, residual.Succeeded))
		done <- result{r, err}
	}()
	f.lockedWorkerPID(f.admin) // the commit waits on the row lock
	cancel()
	require.NoError(t, tx.Rollback(ctx))
	out := <-done
	require.NoError(t, out.err)
	require.Equal(t, residual.Succeeded, out.r.State)
	require.Equal(t, ledger.Replay, f.requireNoSecondDispatch(p))

	_, err := f.l.Reserve(cctx, params("charge:cancel-2", "worker"))
	require.ErrorIs(t, err, context.Canceled, "an ended context starts no new write")
}

// A commit that cannot finish within the write timeout (here: blocked on a row lock another
// session holds) returns ledger.ErrOutcomeUnknown instead of hanging; the blocked statement is
// cancelled on the server and its connection is never reused, so the ledger keeps working
// and the residual is either still pending under the holder's fence or committed, never
// anything else.
func TestWriteTimeoutEndsABlockedCommit(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	app := "tf-timeout-" + strings.ToLower(rand.Text()[:10])
	l, err := postgres.Open(context.Background(), withParams(url.Values{"application_name": {app}}),
		postgres.Options{Schema: schema, MaxConns: 2, WriteTimeout: 1500 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ctx := context.Background()
	p := params("charge:timeout", "worker")
	res, err := l.Reserve(ctx, p)
	require.NoError(t, err)

	tx := lockRow(t, schema, p.Key)

	done := make(chan error, 1)
	go func() {
		_, err := l.Commit(ctx, commitOf(p, res, residual.Succeeded))
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a commit blocked on a lock outlived its write timeout")
	}
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
	require.Contains(t, err.Error(), "could not be re-read")

	// The server was asked to cancel the blocked statement: nobody of ours waits on the lock.
	admin := adminConn(t, schema)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n))
		return n == 0
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, tx.Rollback(ctx))

	got, err := l.Get(ctx, ledger.GetParams{Namespace: ns, Key: p.Key})
	require.NoError(t, err, "the pool hands out no connection with a stale reply")
	require.Equal(t, residual.Pending, got.State, "the cancelled commit did not land")
	out, err := l.Commit(ctx, commitOf(p, res, residual.Succeeded))
	require.NoError(t, err, "the holder's fence still holds: its commit goes through now")
	require.Equal(t, residual.Succeeded, out.State)
	for i := range 4 { // every pooled connection works
		_, err := l.Reserve(ctx, params(fmt.Sprintf("after-timeout-%d", i), "worker"))
		require.NoError(t, err)
	}
}

// openSecond opens another ledger on f's schema, straight to the server: another process.
func (f *faultEnv) openSecond(app string) *postgres.Ledger {
	f.t.Helper()
	l, err := postgres.Open(context.Background(), withParams(url.Values{"application_name": {app}}),
		postgres.Options{Schema: f.schema, MaxConns: 1})
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = l.Close() })
	return l
}

// A failed commit lands, its reply is lost, and before the retry another holder takes the
// key over: the retry recognises the recorded commit (not only the current attempt's) and
// answers it, instead of reporting lease_lost and writing a "late commit refused" entry.
func TestFaultCommitReplyLostThenTakenOver(t *testing.T) {
	t.Parallel()
	proxy := newFaultProxy(t)
	f := newFaultEnv(t, func(v url.Values) string {
		v.Set("default_query_exec_mode", "simple_protocol")
		return proxy.dsn(v)
	})
	other := f.openSecond("tf-fault-other")
	p := params("charge:lost-then-taken", "worker")
	res := f.acquireAndExecute(p)
	succ := p
	succ.Holder = "successor"
	var taken *ledger.ReserveResult
	proxy.onCut = func() {
		var err error
		taken, err = other.Reserve(context.Background(), succ)
		require.NoError(t, err)
	}

	proxy.loseReplyTo("att_released = true")
	r, err := f.l.Commit(context.Background(), commitOf(p, res, residual.Failed))
	require.Equal(t, int32(1), proxy.cuts.Load(), "the commit's reply was lost")
	require.NotNil(t, taken)
	require.Equal(t, ledger.Acquired, taken.Decision, "the successor took the failed key over before the retry")
	require.NoError(t, err, "the commit landed: its retry is answered as recorded")
	require.Empty(t, r.Evidence, "no late-commit evidence for a commit that landed")
	got, err := other.Get(context.Background(), ledger.GetParams{Namespace: ns, Key: p.Key})
	require.NoError(t, err)
	require.Empty(t, got.Evidence)
	require.Equal(t, residual.Failed, got.Attempts[0].Outcome)
	require.Equal(t, "successor", got.Current().Holder)
}

// writeRaced runs step on f's ledger while the key's row is locked, lets another ledger's
// identical step queue behind it, then kills f's backend: f's write did not land, and its
// retry queues behind the other one. It returns f's result once the lock is released.
func (f *faultEnv) writeRaced(key string, step, otherStep func() error) error {
	f.t.Helper()
	ctx := context.Background()
	tx := lockRow(f.t, f.schema, key)
	done := make(chan error, 1)
	go func() { done <- step() }()
	pid := f.lockedWorkerPID(f.admin)
	otherDone := make(chan error, 1)
	go func() { otherDone <- otherStep() }()
	require.Eventually(f.t, func() bool {
		var n int
		return f.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'tf-fault-other' AND wait_event_type = 'Lock'`).Scan(&n) == nil && n == 1
	}, 20*time.Second, 5*time.Millisecond, "the other step never waited on the lock")
	terminate(f.t, f.admin, pid)
	require.Eventually(f.t, func() bool {
		var n int
		return f.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, f.app).Scan(&n) == nil && n == 1
	}, 20*time.Second, 5*time.Millisecond, "the retry never queued behind the other step")
	require.NoError(f.t, tx.Rollback(ctx))
	require.NoError(f.t, <-otherDone)
	return <-done
}

// A retried AppendEvidence whose first try never landed is not fooled by another caller's
// identical entry: both observations are kept.
func TestFaultEvidenceRetryIsNotAnothersEntry(t *testing.T) {
	t.Parallel()
	f := newFaultEnv(t, withParams)
	other := f.openSecond("tf-fault-other")
	ctx := context.Background()
	p := params("charge:evidence-race", "worker")
	f.acquireAndExecute(p)
	ev := ledger.EvidenceParams{Namespace: ns, Key: p.Key, Evidence: residual.Evidence{Holder: "probe", Note: "upstream says paid"}}

	err := f.writeRaced(p.Key, func() error {
		_, err := f.l.AppendEvidence(ctx, ev)
		return err
	}, func() error {
		_, err := other.AppendEvidence(ctx, ev)
		return err
	})
	require.NoError(t, err)
	got, err := other.Get(ctx, ledger.GetParams{Namespace: ns, Key: p.Key})
	require.NoError(t, err)
	require.Len(t, got.Evidence, 2, "each caller's observation is its own entry")
}

// A retried Resolve whose first try never landed is not fooled by another caller's
// identical resolution: it is refused as already settled, and one resolution is recorded.
func TestFaultResolveRetryIsNotAnothersResolution(t *testing.T) {
	t.Parallel()
	f := newFaultEnv(t, withParams)
	other := f.openSecond("tf-fault-other")
	ctx := context.Background()
	p := params("charge:resolve-race", "worker")
	p.TTL = time.Second
	f.acquireAndExecute(p)
	f.l.SetTimeOffset(time.Minute)
	other.SetTimeOffset(time.Minute)
	rp := ledger.ResolveParams{Namespace: ns, Key: p.Key, As: residual.Succeeded, By: "ops", Note: "checked upstream"}

	err := f.writeRaced(p.Key, func() error {
		_, err := f.l.Resolve(ctx, rp)
		return err
	}, func() error {
		_, err := other.Resolve(ctx, rp)
		return err
	})
	require.ErrorIs(t, err, residual.ErrInvalidTransition, "this caller's resolution never landed")
	got, err := other.Get(ctx, ledger.GetParams{Namespace: ns, Key: p.Key})
	require.NoError(t, err)
	require.Len(t, got.Resolutions, 1)
}

// proxiedWithSecond is a fault env whose ledger talks through a proxy (SQL text on the wire,
// so a statement can be recognised) and a second ledger on the same schema that acts
// between a lost reply and its retry.
func proxiedWithSecond(t *testing.T) (*faultProxy, *faultEnv, *postgres.Ledger) {
	t.Helper()
	proxy := newFaultProxy(t)
	f := newFaultEnv(t, func(v url.Values) string {
		v.Set("default_query_exec_mode", "simple_protocol")
		return proxy.dsn(v)
	})
	return proxy, f, f.openSecond("tf-fault-other")
}

// collectAndTake has other collect the settled residual of p (GC) and reserve its key
// afresh as "newcomer"; it returns the newcomer's reservation.
func collectAndTake(t *testing.T, other *postgres.Ledger, p ledger.ReserveParams) *ledger.ReserveResult {
	t.Helper()
	ctx := context.Background()
	gc, err := other.GC(ctx, ledger.GCParams{Namespace: ns, Before: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Equal(t, 1, gc.Deleted, "the settled residual is collected")
	q := p
	q.Holder = "newcomer"
	res, err := other.Reserve(ctx, q)
	require.NoError(t, err)
	require.Equal(t, ledger.Acquired, res.Decision)
	return res
}

// Finding 5 of docs/reliability.md: a Reserve acquires, its reply is lost, and before the
// retry the lease expires and another holder takes the key. The retry cannot find its own
// attempt as the current one, and must not judge afresh (in_progress would deny an attempt
// that stands recorded): the outcome is unknown, and nothing may be dispatched.
func TestFaultReserveReplyLostThenTakenOver(t *testing.T) {
	t.Parallel()
	proxy, f, other := proxiedWithSecond(t)
	p := params("charge:reserve-lost-taken", "worker")
	p.TTL = time.Second
	var taken *ledger.ReserveResult
	proxy.onCut = func() {
		other.SetTimeOffset(time.Minute) // the worker's lease is over on the ledger's clock
		q := p
		q.Holder, q.Redispatch = "successor", true
		var err error
		taken, err = other.Reserve(context.Background(), q)
		require.NoError(t, err)
	}
	proxy.loseReplyTo("ON CONFLICT (namespace, key) DO NOTHING")
	res, err := f.l.Reserve(context.Background(), p)
	require.Equal(t, int32(1), proxy.cuts.Load(), "the reservation's reply was lost")
	require.NotNil(t, taken)
	require.Equal(t, ledger.Acquired, taken.Decision, "the successor took the expired key over")
	require.Equal(t, uint64(2), taken.Lease.Token)
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown, "got %v", res)
	require.Nil(t, res)
	t.Log(err)
	got, err := other.Get(context.Background(), ledger.GetParams{Namespace: ns, Key: p.Key})
	require.NoError(t, err)
	require.Equal(t, "worker", got.Attempts[0].Holder, "the lost reply's attempt stands recorded")
	require.Len(t, got.Attempts, 2)
}

// Finding 6: a Resolve lands, its reply is lost, and before the retry GC collects the
// resolved residual and a new holder reserves the key. The retry cannot find its own
// resolution and must not judge the new residual afresh: the outcome is unknown.
func TestFaultResolveReplyLostThenCollected(t *testing.T) {
	t.Parallel()
	proxy, f, other := proxiedWithSecond(t)
	ctx := context.Background()
	p := params("charge:resolve-lost-collected", "worker")
	p.TTL = time.Second
	f.acquireAndExecute(p)
	f.l.SetTimeOffset(time.Minute)
	other.SetTimeOffset(time.Minute)
	proxy.onCut = func() { collectAndTake(t, other, p) }
	proxy.loseReplyTo("commit")
	r, err := f.l.Resolve(ctx, ledger.ResolveParams{Namespace: ns, Key: p.Key, As: residual.Failed, By: "ops", Note: "checked upstream"})
	require.Equal(t, int32(1), proxy.cuts.Load(), "the resolution's reply was lost")
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown, "got %v", r)
	require.NotErrorIs(t, err, residual.ErrInProgress)
	t.Log(err)
	got, err := other.Get(ctx, ledger.GetParams{Namespace: ns, Key: p.Key})
	require.NoError(t, err)
	require.Equal(t, "newcomer", got.Current().Holder)
	require.Empty(t, got.Resolutions, "the retry resolved nothing on the new residual")
}

// Finding 7: a Commit lands, its reply is lost, and before the retry GC collects the
// settled residual and a new holder reserves the key. The retry cannot find its attempt and
// must not refuse the commit as a lost lease (it landed): the outcome is unknown.
func TestFaultCommitReplyLostThenCollected(t *testing.T) {
	t.Parallel()
	proxy, f, other := proxiedWithSecond(t)
	ctx := context.Background()
	p := params("charge:commit-lost-collected", "worker")
	res := f.acquireAndExecute(p)
	proxy.onCut = func() { collectAndTake(t, other, p) }
	proxy.loseReplyTo("att_released = true")
	r, err := f.l.Commit(ctx, commitOf(p, res, residual.Failed))
	require.Equal(t, int32(1), proxy.cuts.Load(), "the commit's reply was lost")
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown, "got %v", r)
	require.NotErrorIs(t, err, residual.ErrLeaseLost)
	t.Log(err)
	got, err := other.Get(ctx, ledger.GetParams{Namespace: ns, Key: p.Key})
	require.NoError(t, err)
	require.Empty(t, got.Evidence, "no late-commit evidence on the new residual")
}

// A Reserve whose transaction is killed before its COMMIT was sent wrote nothing: the retry
// judges the key afresh (here: free after a failed attempt, so it acquires) rather than
// answering that the outcome is unknown.
func TestFaultReserveKilledBeforeCommitIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	f := newFaultEnv(t, withParams)
	ctx := context.Background()
	p := params("charge:reserve-killed-in-tx", "worker")
	res := f.acquireAndExecute(p)
	_, err := f.l.Commit(ctx, commitOf(p, res, residual.Failed))
	require.NoError(t, err)

	tx := lockRow(t, f.schema, p.Key)
	done := make(chan error, 1)
	var again *ledger.ReserveResult
	go func() {
		var err error
		again, err = f.l.Reserve(ctx, p) // takes the failed key over: a locking transaction
		done <- err
	}()
	terminate(t, f.admin, f.lockedWorkerPID(f.admin))
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-done, "the killed transaction wrote nothing; the retry decides afresh")
	require.Equal(t, ledger.Acquired, again.Decision)
	require.Equal(t, uint64(2), again.Lease.Token)
}
