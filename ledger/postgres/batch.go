package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// A group lets concurrent calls of one step (Reserve's insert, Commit's fenced update) share
// a statement and so a transaction and its WAL flush. A call that finds the step idle runs
// alone on its own path, exactly as it would without the group; so does a call that finds
// it busy with nothing queued while at most above calls are in flight in the ledger: it
// runs beside the busy one, with no slot (PostgreSQL groups the flushes of a few
// concurrent commits itself). Otherwise calls that arrive while limit runs are in flight
// queue, and the first run to finish takes the whole queue (up to max calls, one per key)
// into one statement. Under a few callers nothing is shared; under many, one durable
// commit answers many calls.
//
// Only the first try of a step is shared. Whatever a shared statement cannot settle (a key
// already taken, a fence that does not hold, a failed or broken statement) goes back to its
// caller, which runs its own path from there, told whether the shared statement may have
// landed; so every case that is not the fast one behaves exactly as without the group.
type group[J job] struct {
	limit int                   // runs in flight at once: lone calls and shared statements
	max   int                   // calls per shared statement
	many  func(batch []J)       // runs a shared statement and settles its jobs
	load  *atomic.Int64         // the ledger's Reserves and Commits in flight
	above int64                 // the load above which calls queue behind a busy step
	mu    sync.Mutex            // guards what follows
	busy  int                   // runs in flight
	queue []J                   // calls waiting, oldest first
	wait  map[J]chan<- struct{} // set while a job waits in the queue
}

// A job is one call waiting in a group.
type job interface {
	comparable
	// id names the row the job writes: two jobs of one id never share a statement.
	id() string
	// cost is what the job adds to a shared statement (its payload bytes); a statement
	// takes jobs until their costs pass maxBatchBytes.
	cost() int
	// share is where the group records that the job ran in a shared statement; the
	// statement's outcome for it is in the job itself.
	share() *shared
}

// shared is the outcome of a shared statement for one job: done (settled, nothing left to
// do) or, when not done, whether the statement may have written the job's row (landed).
type shared struct {
	ran, done, landed bool
	// hold is set while the job runs in a slot of its own (join): the timer that frees a
	// slot held too long. left: that slot is free again, set once by release or by hold.
	hold *time.Timer
	left atomic.Bool
}

const (
	// groupLimit bounds the runs of one step in flight at once. One measured best on two
	// cores at 8 and 64 callers (docs/benchmarks.md): with more, the statements are
	// smaller and their flushes more.
	groupLimit = 1
	// shareAbove is the load (Reserves and Commits of one ledger in flight, the call's own
	// included) up to which a call does not queue behind a busy step unless calls are
	// already queued there (left from a burst above it, which drains as shared
	// statements). At 8 callers sharing cost 10–40 % on a fast disk (the queued calls
	// wait for the running statement's flush instead of running beside it), while at 64
	// it halves the time of a call (docs/benchmarks.md).
	shareAbove = 8
	// maxBatch bounds the calls of one shared statement.
	maxBatch = 128
	// maxBatchBytes bounds the payload (results) of one shared statement.
	maxBatchBytes = 4 << 20
	// maxHold bounds how long a call running alone keeps the slot while its first
	// statement has not answered (it waits on a lock, on a connection, between retries):
	// past it the queue runs beside it.
	maxHold = 50 * time.Millisecond
)

// newGroup returns a group whose shared statements many runs, under the ledger's load.
func newGroup[J job](many func([]J), load *atomic.Int64) *group[J] {
	return &group[J]{limit: groupLimit, max: maxBatch, many: many, load: load, above: shareAbove,
		wait: map[J]chan<- struct{}{}}
}

// join enters j. It returns alone when j may run its own path now (in a slot, or beside
// the runs in flight when the load is low): the caller then runs it and calls release.
// Otherwise j has run in a shared statement (j.share() says how that went) and release
// does nothing for it. It returns ctx's error, with nothing written,
// when ctx ends while j waits in the queue.
func (g *group[J]) join(ctx context.Context, j J) (alone bool, err error) {
	g.mu.Lock()
	if len(g.queue) == 0 {
		if g.busy < g.limit {
			g.busy++
			g.mu.Unlock()
			g.alone(j.share())
			return true, nil
		}
		if g.load.Load() <= g.above {
			g.mu.Unlock()
			return true, nil // beside the run: no slot, no hold, release does nothing
		}
	}
	ready := make(chan struct{})
	g.queue = append(g.queue, j)
	g.wait[j] = ready
	g.mu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
		g.mu.Lock()
		if _, queued := g.wait[j]; queued {
			delete(g.wait, j)
			g.queue = slices.DeleteFunc(g.queue, func(q J) bool { return q == j })
			g.mu.Unlock()
			return false, ctx.Err()
		}
		g.mu.Unlock()
		<-ready
	}
	sh := j.share()
	if sh.ran {
		return false, nil
	}
	g.alone(sh)
	return true, nil
}

// alone marks sh as running in a slot of its own, which maxHold frees if release has not.
func (g *group[J]) alone(sh *shared) {
	sh.hold = time.AfterFunc(maxHold, func() { g.free(sh) })
}

// free frees sh's slot, once.
func (g *group[J]) free(sh *shared) {
	if sh.left.CompareAndSwap(false, true) {
		g.leave()
	}
}

// release frees the slot of a job that runs alone, once: a caller releases it as soon as
// its first statement (the one the group would share) has answered, so that what its own
// path does afterwards (lock waits, retries) never holds up the queue. Later calls, and
// calls for a job that ran in a shared statement or beside a busy step, do nothing.
func (g *group[J]) release(j J) {
	if sh := j.share(); sh.hold != nil {
		sh.hold.Stop()
		g.free(sh)
	}
}

// leave ends a run: when calls are queued it starts the next run (a lone one keeps the
// slot; a shared statement runs on its own goroutine), otherwise it frees the slot.
func (g *group[J]) leave() {
	g.mu.Lock()
	if len(g.queue) == 0 {
		g.busy--
		g.mu.Unlock()
		return
	}
	batch, rest := g.take()
	g.queue = rest
	ready := make([]chan<- struct{}, len(batch))
	for i, j := range batch {
		ready[i] = g.wait[j]
		delete(g.wait, j)
	}
	g.mu.Unlock()
	if len(batch) == 1 {
		close(ready[0]) // it runs alone, in the slot this run held
		return
	}
	go func() {
		for _, j := range batch {
			j.share().ran = true
		}
		g.many(batch)
		for _, r := range ready {
			close(r)
		}
		g.leave()
	}()
}

// take splits the queue into the next shared statement's jobs (oldest first, one per id,
// at most max and about maxBatchBytes) and the jobs left queued.
func (g *group[J]) take() (batch, rest []J) {
	ids := map[string]bool{}
	bytes := 0
	for _, j := range g.queue {
		if len(batch) >= g.max || len(batch) > 0 && bytes+j.cost() > maxBatchBytes || ids[j.id()] {
			rest = append(rest, j)
			continue
		}
		ids[j.id()] = true
		bytes += j.cost()
		batch = append(batch, j)
	}
	return batch, rest
}

// reserveJob is a Reserve in its group: the call, its reservation id, and what a shared
// insert made of it.
type reserveJob struct {
	p           ledger.ReserveParams
	reservation string
	ctx         context.Context
	out         *ledger.ReserveResult // set when sh.done
	sh          shared
}

func (j *reserveJob) id() string     { return j.p.Namespace + "\x00" + j.p.Key }
func (j *reserveJob) cost() int      { return 0 }
func (j *reserveJob) share() *shared { return &j.sh }

// commitJob is a Commit in its group.
type commitJob struct {
	p   ledger.CommitParams
	ctx context.Context
	out *residual.Residual // set when sh.done
	sh  shared
}

func (j *commitJob) id() string     { return j.p.Namespace + "\x00" + j.p.Key }
func (j *commitJob) cost() int      { return len(j.p.Result) + len(j.p.Error) }
func (j *commitJob) share() *shared { return &j.sh }

// reserveManySQL is reserveSQL for many calls at once, one row per element of its arrays
// ($1 namespaces, $2 keys, $3 tasks, $4 operations, $5 targets, $6 request digests, $7
// holders, $8 reservation ids, $9 ttls µs; $10 time offset µs). A key that has a row is
// skipped; each row inserted comes back with its reservation id, its clock and whether a
// watcher is registered.
var reserveManySQL = notifyModes(func(watched string) string {
	start := statementNow(10)
	return `INSERT INTO toolfence_residuals (namespace, key, task, operation, target, state, request_digest,
	token, att_n, att_holder, att_token, att_lease_expires, att_started, att_request_digest,
	att_reservation, created_at, updated_at)
SELECT b.bns, b.bkey, b.btask, b.bop, b.btarget, 'pending', b.bdigest, 1, 1, b.bholder, 1,
	` + start + ` + b.bttl * interval '1 microsecond', ` + start + `, b.bdigest, b.bres, ` + start + `, ` + start + `
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::bigint[])
	AS b(bns, bkey, btask, bop, btarget, bdigest, bholder, bres, bttl)
ON CONFLICT (namespace, key) DO NOTHING
RETURNING att_reservation, created_at, ` + watched
})

// sharedSettingsSQL sets, for the rest of its transaction only:
//   - plan_cache_mode: the shared statement runs its generic plan. Its arrays have a
//     length the planner sees in each custom plan, so PostgreSQL would keep planning it
//     anew (the generic plan assumes ten rows and costs more), and planning costs as much
//     as running it (measured: 4 calls' commits, 1.08 ms planned each time against
//     0.55 ms generic).
//   - enable_hashjoin, enable_mergejoin, enable_bitmapscan, enable_seqscan: the generic
//     plan reads each row by key, in the arrays' order. A connection keeps the plan it
//     made first, and made on a small table (a new schema; statistics not yet gathered,
//     or never, without autovacuum) the planner preferred to hash the arrays against a
//     scan of every open residual, or to scan the table once per element: each shared
//     commit then read the whole open set, dead index entries included (measured at 8
//     callers on a new schema with every call queueing: 382 µs of server CPU per call,
//     against 221 µs with these settings and $16; ba171e9 used 232–246 µs).
//   - lock_timeout: a shared statement that would wait more than a second on a row lock
//     (a row another transaction holds) fails instead, having written nothing, and each of
//     its calls goes on alone: only the call of that row waits.
const sharedSettingsSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('lock_timeout', '1s', true),
	set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
	set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)`

// byID orders jobs by the row they write, so that statements sharing rows lock them in
// one order and never wait on each other in a cycle.
func byID[J job](batch []J) {
	slices.SortFunc(batch, func(a, b J) int { return strings.Compare(a.id(), b.id()) })
}

// runShared runs sql, the shared statement of the jobs of shares, as a write of its own:
// under a context without the callers' cancellation (with the values of first), bounded by
// the write timeout, sent after sharedSettingsSQL in one round trip and one transaction.
// scan reads each row it returns; once the transaction has committed, settle marks the
// jobs it wrote done (and sends their notifications). When the try broke after the
// statement was sent, or failed after it committed (a row that could not be read), every
// job not settled is told that it may have landed.
func (l *Ledger) runShared(first context.Context, shares []*shared, sql string, args []any,
	scan func(pgx.Rows) error, settle func(context.Context, *pgxpool.Conn)) {
	run := context.WithoutCancel(first)
	deadline := time.Now().Add(l.writeTimeout)
	actx, cancel := context.WithDeadline(run, deadline)
	defer cancel()
	var committed bool
	f, _ := l.try(actx, run, deadline, func(ctx context.Context, c *pgxpool.Conn) error {
		var err error
		if committed, err = sendShared(ctx, c, sql, args, scan); err != nil {
			return err
		}
		settle(ctx, c)
		return nil
	})
	if f == ambiguous || f != succeeded && committed {
		for _, sh := range shares {
			sh.landed = !sh.done
		}
	}
}

// sendShared sends sharedSettingsSQL and sql in one round trip, in one transaction, reads
// every row of sql with scan and closes the batch: committed says that the transaction
// committed (the batch closed without error), even when scan failed on a row (its error is
// returned).
func sendShared(ctx context.Context, c *pgxpool.Conn, sql string, args []any, scan func(pgx.Rows) error) (committed bool, err error) {
	b := &pgx.Batch{}
	b.Queue(sharedSettingsSQL)
	b.Queue(sql, args...)
	sent := c.SendBatch(ctx, b)
	if _, err := sent.Exec(); err != nil {
		return false, errors.Join(err, sent.Close())
	}
	rows, err := sent.Query()
	if err != nil {
		return false, errors.Join(err, sent.Close())
	}
	var scanErr error
	for rows.Next() {
		if scanErr == nil {
			scanErr = scan(rows)
		}
	}
	rows.Close()
	if err := errors.Join(rows.Err(), sent.Close()); err != nil {
		return false, err
	}
	return true, scanErr
}

// reserveMany runs batch's inserts in one statement. A job whose row it inserted is done;
// the others (key taken, statement failed) go back to their callers.
func (l *Ledger) reserveMany(batch []*reserveJob) {
	oldest := batch[0].ctx
	byID(batch)
	n := len(batch)
	ns, keys, tasks, ops, targets := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	digests, holders, res, ttls := make([]string, n), make([]string, n), make([]string, n), make([]int64, n)
	byRes := make(map[string]*reserveJob, n)
	shares := make([]*shared, n)
	for i, j := range batch {
		p := j.p
		ns[i], keys[i], tasks[i], ops[i], targets[i] = p.Namespace, p.Key, p.Task, p.Operation, p.Target
		digests[i], holders[i], res[i], ttls[i] = p.RequestDigest, p.Holder, j.reservation, p.TTL.Microseconds()
		byRes[j.reservation], shares[i] = j, &j.sh
	}
	type insert struct {
		j       *reserveJob
		created time.Time
		watched bool
	}
	var ins []insert
	scan := func(rows pgx.Rows) error {
		var r string
		var in insert
		if err := rows.Scan(&r, &in.created, &in.watched); err != nil {
			return err
		}
		if in.j = byRes[r]; in.j == nil {
			return fmt.Errorf("postgres: a shared insert returned a reservation it was not given")
		}
		ins = append(ins, in)
		return nil
	}
	settle := func(ctx context.Context, c *pgxpool.Conn) {
		for _, in := range ins {
			in.j.out, in.j.sh.done = acquired(inserted(in.j.p, in.created)), true
			l.notifyAfter(ctx, c, in.watched, in.j.p.Namespace, in.j.p.Key, residual.Pending)
		}
	}
	l.runShared(oldest, shares, reserveManySQL[l.mode()],
		[]any{ns, keys, tasks, ops, targets, digests, holders, res, ttls, l.offset.Load()}, scan, settle)
}

// commitManySQL is commitSQL for many calls at once, one row per element of its arrays ($1
// indexes, $2 namespaces, $3 keys, $4 holders, $5 tokens, $6 outcomes, $7 response digests,
// $8 errors, $9 margins µs, $10 whether the outcome stores its result, then result, result
// digest, truncation flag and handle ($11–$14); $15 time offset µs; $16 'pending'). Each
// residual whose fence holds is committed and comes back with its index first, then as
// commitSQL returns it.
//
// Its plan must read each array element's row by key (a nested loop over the arrays, the
// primary key inside), whatever the table's size when the plan was made: sharedSettingsSQL
// rules out the other joins and scans, the pending state is a parameter ($16) rather than
// a literal, so that the planner cannot read the open residuals' index whole instead (a
// literal proves that index's predicate), and since migration 0007 no other index begins
// with the namespace (at schema 6 the loop read toolfence_residuals_target by namespace).
// TestSharedCommitReadsRowsByKey holds this.
var commitManySQL = notifyModes(func(watched string) string {
	at := statementNow(15)
	keep := func(col, b string) string {
		return col + ` = CASE WHEN b.bstore THEN b.` + b + ` ELSE r.` + col + ` END`
	}
	return `UPDATE toolfence_residuals r SET
	state = b.bout, att_outcome = b.bout, att_ended = ` + at + `, att_released = true,
	att_response_digest = b.bresp, att_error = b.berr, ` + keep("result", "bresult") + `,
	` + keep("result_digest", "brdigest") + `, ` + keep("result_truncated", "btrunc") + `, ` + keep("handle", "bhandle") + `,
	updated_at = ` + at + `
FROM unnest($1::integer[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::text[],
	$9::bigint[], $10::boolean[], $11::bytea[], $12::text[], $13::boolean[], $14::text[])
	AS b(bi, bns, bkey, bholder, btoken, bout, bresp, berr, bmargin, bstore, bresult, brdigest, btrunc, bhandle)
WHERE r.namespace = b.bns AND r.key = b.bkey AND r.state = $16 AND r.att_outcome = ''
	AND NOT r.att_released AND r.token = b.btoken AND r.att_token = b.btoken AND r.att_holder = b.bholder
	AND r.att_lease_expires - ` + now(15) + ` > b.bmargin * interval '1 microsecond'
RETURNING b.bi, r.task, r.operation, r.target, r.request_digest, r.att_n, r.att_lease_expires,
	r.att_started, r.att_request_digest, r.prior_attempts, r.evidence, r.resolutions, r.created_at,
	r.updated_at, CASE WHEN b.bstore THEN NULL::bytea ELSE r.result END, r.result_digest, r.result_truncated,
	r.handle, ` + watched
})

// indexed scans a row of commitManySQL: its index, which names the job, and the rest into
// what the caller scans, so that scanCommitted reads it as a row of commitSQL of that job.
type indexed struct {
	rows  pgx.Rows
	batch []*commitJob
	j     **commitJob // the job of the row scanned last
	p     *ledger.CommitParams
}

func (x indexed) Scan(dest ...any) error {
	var i int32
	if err := x.rows.Scan(append([]any{&i}, dest...)...); err != nil {
		return err
	}
	if i < 0 || int(i) >= len(x.batch) {
		return fmt.Errorf("postgres: a shared commit returned row %d of %d", i, len(x.batch))
	}
	*x.j, *x.p = x.batch[i], x.batch[i].p
	return nil
}

// commitMany runs batch's fenced commits in one statement. A job whose fence held is done;
// the others (fence not holding, statement failed) go back to their callers, whose own
// path records the evidence.
func (l *Ledger) commitMany(batch []*commitJob) {
	oldest := batch[0].ctx
	byID(batch)
	n := len(batch)
	idx, ns, keys, holders := make([]int32, n), make([]string, n), make([]string, n), make([]string, n)
	tokens, outcomes, resps, errs := make([]int64, n), make([]string, n), make([]string, n), make([]string, n)
	margins, store, results, rdigests := make([]int64, n), make([]bool, n), make([][]byte, n), make([]string, n)
	truncs, handles, shares := make([]bool, n), make([]string, n), make([]*shared, n)
	for i, j := range batch {
		p := j.p
		idx[i], ns[i], keys[i], holders[i], tokens[i] = int32(i), p.Namespace, p.Key, p.Holder, int64(p.Token)
		outcomes[i], resps[i], errs[i], margins[i] = string(p.Outcome), p.ResponseDigest, p.Error, p.Margin.Microseconds()
		if store[i] = storesResult(p.Outcome); store[i] {
			results[i], rdigests[i], truncs[i], handles[i] = nilIfEmpty(p.Result), p.ResultDigest, p.ResultTruncated, p.Handle
		}
		shares[i] = &j.sh
	}
	type commit struct {
		j       *commitJob
		r       *residual.Residual
		watched bool
	}
	var done []commit
	scan := func(rows pgx.Rows) error {
		var cm commit
		var p ledger.CommitParams
		r, err := scanCommitted(indexed{rows: rows, batch: batch, j: &cm.j, p: &p}, &p, &cm.watched)
		if err != nil {
			return err
		}
		cm.r = r
		done = append(done, cm)
		return nil
	}
	settle := func(ctx context.Context, c *pgxpool.Conn) {
		for _, cm := range done {
			cm.j.out, cm.j.sh.done = cm.r, true
			l.notifyAfter(ctx, c, cm.watched, cm.r.Namespace, cm.r.Key, cm.r.State)
		}
	}
	l.runShared(oldest, shares, commitManySQL[l.mode()], []any{idx, ns, keys, holders, tokens, outcomes, resps, errs,
		margins, store, results, rdigests, truncs, handles, l.offset.Load(), string(residual.Pending)}, scan, settle)
}
