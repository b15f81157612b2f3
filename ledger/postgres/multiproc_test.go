package postgres_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
)

// The multi-process test re-executes the test binary as children in the role "reserver"
// (testkit.RoleEnv; TestMain runs it).
const (
	childSchemaEnv = "TOOLFENCE_PG_CHILD_SCHEMA"
	childIndexEnv  = "TOOLFENCE_PG_CHILD_INDEX"

	mpProcesses  = 4
	mpGoroutines = 16
	mpKeys       = 200
	// mpBarrier is the advisory lock the parent holds until every child is ready.
	mpBarrier = 0x7466_6d70
)

// TestMultiProcessExactlyOnce: 4 OS processes × 16 goroutines each reserve the same 200
// keys; whoever acquires a key "executes" it by inserting a row into a plain table with no
// unique constraint, then commits. Exactly one execution per key must be recorded.
func TestMultiProcessExactlyOnce(t *testing.T) {
	// Not parallel: the children hold many connections of their own.
	schema := newSchema(t)
	l := open(t, schema, postgres.Options{})
	ctx := context.Background()
	admin := adminConn(t, schema)
	_, err := admin.Exec(ctx, `CREATE TABLE executions (key text NOT NULL, pid integer NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `SELECT pg_advisory_lock($1)`, mpBarrier)
	require.NoError(t, err)

	type child struct {
		cmd *exec.Cmd
		out bytes.Buffer
	}
	children := make([]*child, mpProcesses)
	for i := range children {
		c := &child{cmd: exec.Command(os.Args[0], "-test.run=^$")}
		c.cmd.Env = append(os.Environ(), testkit.WithRole("reserver"), childSchemaEnv+"="+schema,
			childIndexEnv+"="+strconv.Itoa(i), "TOOLFENCE_TEST_PG="+testDSN())
		c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
		require.NoError(t, c.cmd.Start())
		children[i] = c
	}
	// Release the barrier once every child waits on it, so all 64 goroutines start together.
	require.Eventually(t, func() bool {
		var waiting int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND NOT granted`, mpBarrier).Scan(&waiting)
		return err == nil && waiting == mpProcesses
	}, 60*time.Second, 10*time.Millisecond, "children did not reach the barrier")
	_, err = admin.Exec(ctx, `SELECT pg_advisory_unlock($1)`, mpBarrier)
	require.NoError(t, err)

	for i, c := range children {
		err := c.cmd.Wait()
		require.NoError(t, err, "child %d failed:\n%s", i, c.out.String())
		t.Logf("child %d: %s", i, bytes.TrimSpace(c.out.Bytes()))
	}

	var total, distinct int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*), count(DISTINCT key) FROM executions`).Scan(&total, &distinct))
	require.Equal(t, mpKeys, distinct, "every key executed")
	require.Equal(t, mpKeys, total, "no key executed twice")

	page, err := l.List(ctx, ledger.ListParams{Namespace: ns, States: []residual.State{residual.Succeeded}, Limit: 1000})
	require.NoError(t, err)
	require.Len(t, page.Residuals, mpKeys)
	for _, r := range page.Residuals {
		require.Len(t, r.Attempts, 1, "key %s", r.Key)
		require.Equal(t, uint64(1), r.Token)
	}
}

// reserver is the body of one child process (role "reserver"): an error exits it with 1,
// the test's verdict on it.
func reserver() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	idx := os.Getenv(childIndexEnv)
	l, err := postgres.Open(ctx, testDSN(), postgres.Options{Schema: os.Getenv(childSchemaEnv), MaxConns: 8, DisableAutoMigrate: true})
	if err != nil {
		return err
	}
	defer l.Close()
	// Wait at the parent's barrier.
	if _, err := l.Pool().Exec(ctx, `SELECT pg_advisory_lock_shared($1), pg_advisory_unlock_shared($1)`, mpBarrier); err != nil {
		return err
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		counts   = map[ledger.Decision]int{}
	)
	seed, _ := strconv.Atoi(idx)
	for g := range mpGoroutines {
		wg.Go(func() {
			holder := fmt.Sprintf("proc-%s/g-%02d", idx, g)
			// Even goroutines of every process walk the keys in the same order, so up to 32
			// of them race for each key at once; odd ones walk a random order.
			order := rand.New(rand.NewPCG(uint64(seed), uint64(g))).Perm(mpKeys)
			if g%2 == 0 {
				for i := range order {
					order[i] = i
				}
			}
			for _, k := range order {
				d, err := guardedExecute(ctx, l, k, holder)
				mu.Lock()
				counts[d]++
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fmt.Printf("pid %d: %v\n", os.Getpid(), counts)
	return firstErr
}

// guardedExecute reserves key k; only when it acquires does it execute (insert into
// executions) and commit.
func guardedExecute(ctx context.Context, l *postgres.Ledger, k int, holder string) (ledger.Decision, error) {
	p := params(fmt.Sprintf("key:%03d", k), holder)
	p.RequestDigest = "same-request"
	res, err := l.Reserve(ctx, p)
	if err != nil {
		return 0, fmt.Errorf("reserve %d: %w", k, err)
	}
	if res.Decision != ledger.Acquired {
		return res.Decision, nil
	}
	if _, err := l.Pool().Exec(ctx, `INSERT INTO executions (key, pid) VALUES ($1, pg_backend_pid())`, p.Target); err != nil {
		return res.Decision, fmt.Errorf("execute %d: %w", k, err)
	}
	_, err = l.Commit(ctx, commitOf(p, res, residual.Succeeded))
	if err != nil {
		return res.Decision, fmt.Errorf("commit %d: %w", k, err)
	}
	return res.Decision, nil
}
