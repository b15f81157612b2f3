package postgres

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/rules"
	"github.com/toolfence/toolfence/residual"
)

// reserveSQL is the atomic insert-if-absent of Reserve: it inserts the pending residual with
// token 1 when the key has no row (the primary key decides, never a prior read) and returns
// it with whether a watcher is registered; when the key has a row it returns nothing and
// Reserve reads the row that won (peekSQL). A key that had a row once keeps it (GC leaves a
// tombstone holding the token), so a new row's token is always 1. It returns only the
// row's clock (created_at) and whether a watcher is registered: everything else the caller
// sent, and inserted rebuilds the row from it.
//
// It is a plain INSERT … RETURNING with no subquery to materialise: PostgreSQL initialises
// and runs it measurably faster than the one-statement form that also returned the
// existing row, which matters for the call every guarded dispatch makes. The clock is the
// statement's start on the server (statement_timestamp()): a lease counted from it ends no
// later than one counted from any moment of the statement.
//
// $1 namespace, $2 key, $3 task, $4 operation, $5 target, $6 request digest, $7 holder,
// $8 reservation id, $9 ttl µs, $10 time offset µs.
var reserveSQL = notifyModes(func(watched string) string {
	start := statementNow(10)
	return `INSERT INTO toolfence_residuals (namespace, key, task, operation, target, state, request_digest,
	token, att_n, att_holder, att_token, att_lease_expires, att_started, att_request_digest,
	att_reservation, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, 'pending', $6, 1, 1, $7, 1, ` + start + ` + $9::bigint * interval '1 microsecond',
	` + start + `, $6, $8, ` + start + `, ` + start + `)
ON CONFLICT (namespace, key) DO NOTHING
RETURNING created_at, ` + watched
})

// peekSQL reads the row of a key, tombstone or not, with the ledger's clock ($1 namespace,
// $2 key, $3 offset µs): what Reserve decides on when its insert found the key taken.
var peekSQL = `SELECT ` + cols("") + `, ` + statementNow(3) + ` FROM toolfence_residuals WHERE namespace = $1 AND key = $2`

// notifyModes builds a write statement for both ways of notifying watchers. build gets an
// expression for the write's RETURNING list, evaluated per written row, that says whether a
// watcher is registered: index 0 also sends pg_notify there, so the notification commits
// with the write; index 1 leaves it owed, and the ledger sends it after the commit
// (Options.NotifyAfterCommit).
func notifyModes(build func(watched string) string) [2]string {
	return [2]string{build(notifyInTx), build(notifyOwed)}
}

// notifyInTx notifies the schema's channel of the written row (namespace, key, state) while
// a watcher is registered (see Watch), and is true when it did. The payload is built by
// toolfence_notify (migration 0003), so a write that nobody watches prepares one function
// call, not the payload's expression.
const notifyInTx = `CASE WHEN EXISTS (SELECT 1 FROM toolfence_watchers) THEN toolfence_notify(namespace, key, state) ELSE false END`

// notifyOwed is true while a watcher is registered.
const notifyOwed = `EXISTS (SELECT 1 FROM toolfence_watchers)`

// notifyAfter sends the change notification of a committed write on c, when the ledger
// notifies after commits and the write owed one. A failure loses the notification only:
// watchers re-list after gaps.
func (l *Ledger) notifyAfter(ctx context.Context, c *pgxpool.Conn, owed bool, namespace, key string, state residual.State) {
	if !owed || !l.notifyAfterCommit {
		return
	}
	payload, err := json.Marshal(notification{Namespace: namespace, Key: key, State: string(state)})
	if err != nil || len(payload) >= 8000 {
		payload, _ = json.Marshal(notification{Key: key, State: string(state)})
	}
	_, _ = c.Exec(ctx, `SELECT pg_notify($1, $2)`, l.channel(), string(payload))
}

// lockSQL reads a residual (or tombstone) under FOR UPDATE and the ledger's clock after the
// lock is granted ($1 namespace, $2 key, $3 offset µs).
var lockSQL = `SELECT ` + cols("s") + `, ` + now(3) + `
FROM (SELECT ` + cols("") + ` FROM toolfence_residuals WHERE namespace = $1 AND key = $2 FOR UPDATE) s`

// getSQL reads a residual (never a tombstone) and the ledger's clock ($1 namespace, $2 key,
// $3 offset µs).
var getSQL = `SELECT ` + cols("") + `, ` + now(3) + ` FROM toolfence_residuals
WHERE namespace = $1 AND key = $2 AND state <> '` + collected + `'`

// fence is the SQL condition that the current attempt is pending under holder $3 and token
// $4 with more than $margin left at the ledger's clock (evaluated per row, after any lock
// wait).
func fence(margin string, off int) string {
	return `r.namespace = $1 AND r.key = $2 AND r.state = 'pending' AND r.att_outcome = ''
	AND NOT r.att_released AND r.token = $4 AND r.att_token = $4 AND r.att_holder = $3
	AND r.att_lease_expires - ` + now(off) + ` > ` + margin
}

// commitSQL is Commit under a valid fence in one statement: terminal state, outcome and
// release in the same row write. Zero rows means the fence does not hold (or the residual is
// missing): Commit then takes the locking path, which records evidence. The fence is checked
// against clock_timestamp(), evaluated per row after any lock wait; the attempt's end is
// stamped with the statement's start. commitSQL[1][mode] also stores the result, result
// digest, truncation flag and handle (a succeeded or accepted outcome); commitSQL[0][mode]
// keeps the stored ones (failed, unknown), so neither evaluates a condition on the outcome.
//
// $1 namespace, $2 key, $3 holder, $4 token, $5 outcome, $6 response digest, $7 error,
// $8 margin µs, $9 offset µs; with the result: $10 result, $11 result digest, $12 result
// truncated, $13 handle.
var commitSQL = [2][2]string{
	notifyModes(func(watched string) string { return commitStatement(watched, false) }),
	notifyModes(func(watched string) string { return commitStatement(watched, true) }),
}

func commitStatement(watched string, withResult bool) string {
	at := statementNow(9)
	set, result := "", "r.result"
	if withResult {
		set = `result = $10, result_digest = $11, result_truncated = $12, handle = $13,`
		result = "NULL::bytea"
	}
	return `UPDATE toolfence_residuals r SET
	state = $5, att_outcome = $5, att_ended = ` + at + `, att_released = true,
	att_response_digest = $6, att_error = $7, ` + set + `
	updated_at = ` + at + `
WHERE ` + fence("$8::bigint * interval '1 microsecond'", 9) + `
RETURNING r.task, r.operation, r.target, r.request_digest, r.att_n, r.att_lease_expires,
	r.att_started, r.att_request_digest, r.prior_attempts, r.evidence, r.resolutions, r.created_at,
	r.updated_at, ` + result + `, r.result_digest, r.result_truncated, r.handle, ` + watched
}

// storesResult reports whether a commit of outcome stores the caller's result (and handle).
func storesResult(outcome residual.State) bool {
	return outcome == residual.Succeeded || outcome == residual.Accepted
}

// scanCommitted scans a row of commitSQL, which returns the columns its caller did not send
// (the result only when the commit kept the stored one), and rebuilds the committed
// residual from it and p, column for column as stored (TestCommitReturnsWhatItStored holds
// the two together).
//
// p is read once the row is scanned: a row of commitManySQL names its call as it is scanned.
func scanCommitted(s pgx.Row, p *ledger.CommitParams, watched *bool) (*residual.Residual, error) {
	var rw row
	var stored []byte
	if err := s.Scan(&rw.task, &rw.operation, &rw.target, &rw.requestDigest, &rw.attN, &rw.attExpires,
		&rw.attStarted, &rw.attRequestDigest, &rw.prior, &rw.evidence, &rw.resolutions, &rw.createdAt,
		&rw.updatedAt, &stored, &rw.resultDigest, &rw.resultTruncated, &rw.handle, watched); err != nil {
		return nil, err
	}
	rw.namespace, rw.key, rw.state, rw.token = p.Namespace, p.Key, string(p.Outcome), int64(p.Token)
	rw.attHolder, rw.attToken, rw.attResponseDigest = p.Holder, int64(p.Token), p.ResponseDigest
	rw.attOutcome, rw.attError, rw.attReleased = string(p.Outcome), p.Error, true
	ended := rw.updatedAt
	rw.attEnded = &ended
	rw.result = stored
	if storesResult(p.Outcome) {
		rw.result = p.Result
	}
	return rw.residual()
}

// renewSQL extends a live lease: $5 ttl µs, $6 offset µs.
var renewSQL = `UPDATE toolfence_residuals r SET
	att_lease_expires = c.now + $5::bigint * interval '1 microsecond', updated_at = c.now
FROM (SELECT ` + now(6) + ` AS now) c
WHERE ` + fence("interval '0'", 6) + `
RETURNING r.att_lease_expires`

// Reserve implements ledger.Ledger. A new key costs one statement (the atomic insert); a
// replay, a key in progress or unknown cost that insert, which writes nothing, and a read of
// the stored row; taking over an existing residual or a tombstone (a retry after failed, a
// re-dispatch, a key reserved again after GC) locks the row in a short transaction. A
// Reserve whose connection breaks is tried again under the same reservation id, so it
// recognises its own insert instead of reporting it as a key in progress. When the break
// came after the write was sent and the retry finds another attempt current (the lease
// ran out and the key was taken over), it cannot tell whether its own attempt landed: it
// returns an error wrapping ledger.ErrOutcomeUnknown, and nothing may be dispatched.
//
// Concurrent Reserves of one Ledger share their insert when more than 8 Reserves and
// Commits are in flight (or calls are already queued): while one runs, those that arrive
// wait, and then run as one statement, one transaction and one WAL flush (see group). A
// call the shared insert does not settle (its key has a row, the statement failed or broke)
// goes on alone exactly as above, told whether the shared statement may have landed.
func (l *Ledger) Reserve(ctx context.Context, p ledger.ReserveParams) (*ledger.ReserveResult, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	j := &reserveJob{p: p, reservation: rand.Text(), ctx: ctx}
	l.calls.Add(1)
	defer l.calls.Add(-1)
	alone, err := l.reserves.join(ctx, j)
	switch {
	case err != nil:
		return nil, l.fail("reserve of key "+p.Key, false, err)
	case alone:
		defer l.reserves.release(j)
	case j.sh.done:
		return j.out, nil
	}
	var out *ledger.ReserveResult
	landed, err := l.retryFrom(ctx, true, j.sh.landed, func(ctx context.Context, c *pgxpool.Conn, mayHaveLanded bool) error {
		var err error
		out, err = l.reserveOnce(ctx, c, p, j.reservation, mayHaveLanded, func() { l.reserves.release(j) })
		return err
	})
	if err != nil {
		return nil, l.fail("reserve of key "+p.Key, landed, err)
	}
	return out, nil
}

// errRaced means a concurrent step changed the row between two statements; Reserve runs
// again (rarely more than once).
var errRaced = errors.New("postgres: raced with a concurrent step")

// reserveOnce is one try of Reserve. After a try that may have landed (mayHaveLanded), the
// key having no row at all proves that it did not (a landed reservation leaves a row, and
// GC leaves a tombstone), and the current attempt carrying this call's reservation id
// proves that it did; anything else is errOwnWriteUnseen, never a fresh decision: the
// earlier try may hold an attempt that another holder has since taken over.
//
// answered runs once the insert has answered: the insert is the step a group shares (see
// group), and what follows it runs outside the group's slot.
func (l *Ledger) reserveOnce(ctx context.Context, c *pgxpool.Conn, p ledger.ReserveParams, reservation string, mayHaveLanded bool, answered func()) (*ledger.ReserveResult, error) {
	for range 8 {
		var created time.Time
		var watched bool
		err := c.QueryRow(ctx, reserveSQL[l.mode()], p.Namespace, p.Key, p.Task, p.Operation, p.Target,
			p.RequestDigest, p.Holder, reservation, p.TTL.Microseconds(), l.offset.Load()).Scan(&created, &watched)
		answered()
		if err == nil {
			res := inserted(p, created)
			l.notifyAfter(ctx, c, watched, res.Namespace, res.Key, res.State)
			return acquired(res), nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, err
		}
		// The key has a row (a committed one: the insert waited for any in-flight one). The
		// insert wrote nothing, so a break from here on is not ambiguous.
		var clock time.Time
		res, rw, err := scanRow(c.QueryRow(ctx, peekSQL, p.Namespace, p.Key, l.offset.Load()), &clock)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, noWrite(err)
		}
		if own := ownReservation(res, rw, reservation); own != nil {
			return own, nil
		}
		if mayHaveLanded {
			return nil, noWrite(fmt.Errorf("reserve of key %s by %s: %w", p.Key, p.Holder, errOwnWriteUnseen))
		}
		if !rw.collected() {
			d, cur, _ := rules.ApplyReserve(res, p, 0, clock.UTC())
			if d != ledger.Acquired {
				return &ledger.ReserveResult{Decision: d, Residual: cur}, nil
			}
		}
		out, err := l.reserveLocked(ctx, c, p, reservation, mayHaveLanded)
		if errors.Is(err, errRaced) {
			continue
		}
		return out, err
	}
	return nil, fmt.Errorf("%w: key %s changed under every try", errRaced, p.Key)
}

// inserted is the residual reserveSQL stored for p at the ledger's clock now, column for
// column (TestReserveReturnsWhatItStored holds the two together).
func inserted(p ledger.ReserveParams, now time.Time) *residual.Residual {
	now = now.UTC()
	return &residual.Residual{
		Key: p.Key, Namespace: p.Namespace, Task: p.Task, Operation: p.Operation, Target: p.Target,
		State: residual.Pending, RequestDigest: p.RequestDigest, Token: 1, AttemptCount: 1,
		Attempts: []residual.Attempt{{
			N: 1, Holder: p.Holder, Token: 1, Started: now, RequestDigest: p.RequestDigest,
			LeaseExpires: now.Add(time.Duration(p.TTL.Microseconds()) * time.Microsecond),
		}},
		CreatedAt: now, UpdatedAt: now,
	}
}

// acquired is the result of a Reserve that wrote res.
func acquired(res *residual.Residual) *ledger.ReserveResult {
	cur := res.Current()
	return &ledger.ReserveResult{
		Decision: ledger.Acquired, Residual: res,
		Lease: lease.Lease{Resource: res.Key, Holder: cur.Holder, Token: cur.Token, Expires: cur.LeaseExpires},
	}
}

// ownReservation returns Acquired when the stored current attempt was written by this very
// Reserve call (an earlier try whose reply was lost) and is still pending.
func ownReservation(res *residual.Residual, rw *row, reservation string) *ledger.ReserveResult {
	if rw.attReservation != reservation || res.State != residual.Pending || rw.attOutcome != "" || rw.attReleased {
		return nil
	}
	return acquired(res)
}

// reserveLocked takes over an existing residual, or a tombstone, in a transaction: lock,
// apply the rules, and write the new attempt with the token after the stored one. On a
// tombstone the key starts afresh, as if it had no residual, but its token keeps growing.
func (l *Ledger) reserveLocked(ctx context.Context, c *pgxpool.Conn, p ledger.ReserveParams, reservation string, mayHaveLanded bool) (*ledger.ReserveResult, error) {
	var out *ledger.ReserveResult
	err := l.locked(ctx, c, p.Namespace, p.Key, true, func(r *residual.Residual, rw *row, now time.Time) (*change, error) {
		if own := ownReservation(r, rw, reservation); own != nil {
			out = own
			return nil, nil
		}
		if mayHaveLanded {
			return nil, fmt.Errorf("reserve of key %s by %s: %w", p.Key, p.Holder, errOwnWriteUnseen)
		}
		next := r.Token + 1
		if rw.collected() {
			r = nil
		}
		d, cur, ls := rules.ApplyReserve(r, p, next, now)
		out = &ledger.ReserveResult{Decision: d, Residual: cur, Lease: ls}
		if d != ledger.Acquired {
			return nil, nil
		}
		return &change{r: cur, reservation: reservation}, nil
	})
	return out, err
}

// errMissing is returned by locked when the residual does not exist (or is a tombstone).
var errMissing = errors.New("postgres: residual missing")

// change is what a locked step writes: the residual and the reservation id of a new attempt
// (empty keeps the stored one).
type change struct {
	r           *residual.Residual
	reservation string
}

// locked runs decide on the residual (namespace, key) read under FOR UPDATE in a
// transaction, with the ledger's clock read after the lock was granted. When decide returns
// a change, locked writes it (and notifies watchers) and commits; otherwise it rolls back. A
// missing residual gives errRaced wrapped around errMissing; so does a tombstone unless
// tombstones is set, in which case decide gets it (rw.collected() reports it).
func (l *Ledger) locked(ctx context.Context, c *pgxpool.Conn, namespace, key string, tombstones bool,
	decide func(r *residual.Residual, rw *row, now time.Time) (*change, error)) error {
	// Every error before COMMIT is sent comes from a transaction that wrote nothing.
	tx, err := c.Begin(ctx)
	if err != nil {
		return noWrite(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	var clock time.Time
	r, rw, err := scanRow(tx.QueryRow(ctx, lockSQL, namespace, key, l.offset.Load()), &clock)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && rw.collected() && !tombstones {
		return noWrite(fmt.Errorf("%w: %w", errRaced, errMissing))
	}
	if err != nil {
		return noWrite(err)
	}
	ch, err := decide(r, rw, clock.UTC())
	if err != nil || ch == nil {
		return noWrite(err)
	}
	owed, err := l.write(ctx, tx, ch)
	if err != nil {
		return noWrite(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	l.notifyAfter(ctx, c, owed, ch.r.Namespace, ch.r.Key, ch.r.State)
	return nil
}

// write stores ch.r (read under FOR UPDATE in tx) and returns whether a notification is
// owed (see notifyModes).
func (l *Ledger) write(ctx context.Context, tx pgx.Tx, ch *change) (bool, error) {
	args, err := writeArgs(ch.r, ch.reservation)
	if err != nil {
		return false, err
	}
	var owed bool
	err = tx.QueryRow(ctx, writeSQL[l.mode()], args...).Scan(&owed)
	return owed, err
}

// Commit implements ledger.Ledger in one statement when the fence holds. When it does not,
// a short transaction applies rules.ApplyCommit to the locked row, which appends the
// caller's observation as evidence and returns its error wrapping residual.ErrLeaseLost.
//
// If the connection breaks after the commit was sent, Commit reconnects and re-reads the
// row under lock, and judges it by the same rule as a first try: when the commit landed
// (this call's, or an identical earlier one) rules.Recorded answers it with the stored
// residual, even if another attempt has started since; when the fence still holds it
// commits there; when this call's refused commit already left its evidence (recognised by
// a write id stored with it) it reports the lost fence again without a second entry;
// otherwise, when the attempt of p.Token is still stored, what it records proves that the
// commit did not land, and Commit records evidence and reports the lost fence. When the
// attempt is gone (the key was collected and reserved afresh, or the attempt trimmed), or
// the row cannot be re-read, it returns an error wrapping ledger.ErrOutcomeUnknown; unless
// the commit landed, the residual then stays pending and turns unknown when its lease
// expires. It never reports a commit that
// did not land as done, so nothing is dispatched twice.
//
// Concurrent Commits of one Ledger share their fenced update as Reserves share their insert;
// a call whose fence does not hold there goes on alone, to the locking path above.
func (l *Ledger) Commit(ctx context.Context, p ledger.CommitParams) (*residual.Residual, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	j := &commitJob{p: p, ctx: ctx}
	l.calls.Add(1)
	defer l.calls.Add(-1)
	alone, err := l.commits.join(ctx, j)
	switch {
	case err != nil:
		return nil, l.fail("commit of key "+p.Key, false, err)
	case alone:
		defer l.commits.release(j)
	case j.sh.done:
		return j.out, nil
	}
	var out *residual.Residual
	var fenceErr error
	writeID := rand.Text()
	landed, err := l.retryFrom(ctx, true, j.sh.landed, func(ctx context.Context, c *pgxpool.Conn, mayHaveLanded bool) error {
		if !mayHaveLanded {
			var watched bool
			args := []any{p.Namespace, p.Key, p.Holder, int64(p.Token), string(p.Outcome), p.ResponseDigest,
				p.Error, p.Margin.Microseconds(), l.offset.Load()}
			q := commitSQL[0][l.mode()]
			if storesResult(p.Outcome) {
				q = commitSQL[1][l.mode()]
				args = append(args, nilIfEmpty(p.Result), p.ResultDigest, p.ResultTruncated, p.Handle)
			}
			res, err := scanCommitted(c.QueryRow(ctx, q, args...), &p, &watched)
			l.commits.release(j) // what follows runs outside the group's slot
			if err == nil {
				out, fenceErr = res, nil
				l.notifyAfter(ctx, c, watched, res.Namespace, res.Key, res.State)
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		err := l.locked(ctx, c, p.Namespace, p.Key, false, func(r *residual.Residual, _ *row, now time.Time) (*change, error) {
			out = r
			if mayHaveLanded && ownEvidence(r, writeID) {
				// This very call's refused commit landed: answer as it would have.
				fenceErr = fmt.Errorf("%w: key %s: the commit was refused and recorded as evidence (%s)",
					residual.ErrLeaseLost, p.Key, r.Evidence[len(r.Evidence)-1].Note)
				r.State = r.EffectiveState(now)
				return nil, nil
			}
			n := len(r.Evidence)
			var write bool
			write, fenceErr = rules.ApplyCommit(r, p, now)
			if mayHaveLanded && fenceErr != nil && !hasAttempt(r, p.Token) {
				// The attempt is gone (trimmed, or the key was collected and started
				// afresh): whether the earlier try committed it cannot be told.
				out, fenceErr = nil, nil
				return nil, fmt.Errorf("commit of key %s token %d: %w", p.Key, p.Token, errOwnWriteUnseen)
			}
			r.State = r.EffectiveState(now)
			if !write {
				return nil, nil // already recorded (by this call's lost try, or an earlier one)
			}
			if len(r.Evidence) > n {
				r.Evidence[n].WriteID = writeID
			}
			return &change{r: r}, nil
		})
		if errors.Is(err, errMissing) {
			if mayHaveLanded {
				// Collected after a commit that may have been this call's.
				out, fenceErr = nil, nil
				return fmt.Errorf("commit of key %s token %d: the residual is gone: %w", p.Key, p.Token, errOwnWriteUnseen)
			}
			out, fenceErr = nil, fmt.Errorf("%w: %w: commit of key %s in namespace %q", residual.ErrLeaseLost, residual.ErrNotFound, p.Key, p.Namespace)
			return nil
		}
		return err
	})
	if err != nil {
		return nil, l.fail("commit of key "+p.Key, landed, err)
	}
	return out, fenceErr
}

// hasAttempt reports whether r still holds the attempt of token: if it does, what that
// attempt records tells whether a commit under the token landed (rules.Recorded).
func hasAttempt(r *residual.Residual, token uint64) bool {
	for _, a := range r.Attempts {
		if a.Token == token {
			return true
		}
	}
	return false
}

// ownEvidence reports whether r holds evidence written by the call with writeID.
func ownEvidence(r *residual.Residual, writeID string) bool {
	for _, e := range r.Evidence {
		if e.WriteID == writeID {
			return true
		}
	}
	return false
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// Renew implements ledger.Ledger in one conditional statement. When the condition fails it
// re-reads the residual and returns rules.ApplyRenew's error, wrapping
// residual.ErrLeaseLost (and residual.ErrNotFound for a missing residual).
func (l *Ledger) Renew(ctx context.Context, p ledger.RenewParams) (lease.Lease, error) {
	if err := l.check(); err != nil {
		return lease.Lease{}, err
	}
	if err := p.Validate(); err != nil {
		return lease.Lease{}, err
	}
	var out lease.Lease
	var fenceErr error
	_, err := l.retry(ctx, true, func(ctx context.Context, c *pgxpool.Conn, _ bool) error {
		for range 8 {
			var expires time.Time
			err := c.QueryRow(ctx, renewSQL, p.Namespace, p.Key, p.Holder, int64(p.Token),
				p.TTL.Microseconds(), l.offset.Load()).Scan(&expires)
			if err == nil {
				out, fenceErr = lease.Lease{Resource: p.Key, Holder: p.Holder, Token: p.Token, Expires: expires.UTC()}, nil
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			var clock time.Time
			r, _, err := scanRow(c.QueryRow(ctx, getSQL, p.Namespace, p.Key, l.offset.Load()), &clock)
			if errors.Is(err, pgx.ErrNoRows) {
				fenceErr = fmt.Errorf("%w: %w: renew of key %s in namespace %q", residual.ErrLeaseLost, residual.ErrNotFound, p.Key, p.Namespace)
				return nil
			}
			if err != nil {
				return err
			}
			if _, err := rules.ApplyRenew(r, p, clock.UTC()); err != nil {
				fenceErr = err
				return nil
			}
			// The fence held at the re-read: a concurrent step moved the row; try again.
		}
		return fmt.Errorf("%w: renew of key %s", errRaced, p.Key)
	})
	if err != nil {
		// A renewal that may have landed only extended the lease: not worth an unknown.
		return lease.Lease{}, l.fail("renew of key "+p.Key, false, err)
	}
	return out, fenceErr
}

// Resolve implements ledger.Ledger: a short transaction locks the residual, applies
// rules.ApplyResolve with the next fencing token and writes it, with a write id of this
// call in the resolution so a retry after a lost answer recognises its own. A retry that
// finds the same residual without its resolution (a residual keeps all of them) knows the
// first try did not land and judges afresh; one that finds the residual collected, or
// collected and started afresh, returns an error wrapping ledger.ErrOutcomeUnknown.
func (l *Ledger) Resolve(ctx context.Context, p ledger.ResolveParams) (*residual.Residual, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var out *residual.Residual
	var ruleErr error
	var wroteOn time.Time // the residual (its CreatedAt) the last written try resolved
	writeID := rand.Text()
	landed, err := l.retry(ctx, true, func(ctx context.Context, c *pgxpool.Conn, mayHaveLanded bool) error {
		err := l.locked(ctx, c, p.Namespace, p.Key, false, func(r *residual.Residual, _ *row, now time.Time) (*change, error) {
			if mayHaveLanded && ownResolution(r, writeID) {
				out, ruleErr = r, nil
				r.State = r.EffectiveState(now)
				return nil, nil
			}
			if mayHaveLanded && !r.CreatedAt.Equal(wroteOn) {
				out, ruleErr = nil, nil
				return nil, fmt.Errorf("resolve of key %s: the residual was collected and started afresh: %w", p.Key, errOwnWriteUnseen)
			}
			// Not landed: the same residual, which keeps every resolution, lacks it.
			if ruleErr = rules.ApplyResolve(r, p, r.Token+1, now); ruleErr != nil {
				out = nil
				return nil, nil
			}
			r.Resolutions[len(r.Resolutions)-1].WriteID = writeID
			out, wroteOn = r, r.CreatedAt
			return &change{r: r}, nil
		})
		if errors.Is(err, errMissing) {
			if mayHaveLanded {
				out, ruleErr = nil, nil
				return fmt.Errorf("resolve of key %s: the residual is gone: %w", p.Key, errOwnWriteUnseen)
			}
			out, ruleErr = nil, fmt.Errorf("%w: resolve of key %s in namespace %q", residual.ErrNotFound, p.Key, p.Namespace)
			return nil
		}
		return err
	})
	if err != nil {
		return nil, l.fail("resolve of key "+p.Key, landed, err)
	}
	return out, ruleErr
}

// ownResolution reports whether r holds the resolution written by the call with writeID:
// a retry recognises its own write by that id, never by content, so another caller's
// identical resolution is not taken for its own.
func ownResolution(r *residual.Residual, writeID string) bool {
	for _, res := range r.Resolutions {
		if res.WriteID == writeID {
			return true
		}
	}
	return false
}

// AppendEvidence implements ledger.Ledger in a short transaction. An observation without a
// time gets the ledger's clock. The stored observation carries a write id of this call, so
// a retry after a lost answer recognises its own entry (and not another caller's identical
// one); like Resolve's, a retry that finds the residual collected or started afresh returns
// an error wrapping ledger.ErrOutcomeUnknown.
func (l *Ledger) AppendEvidence(ctx context.Context, p ledger.EvidenceParams) (*residual.Residual, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var out *residual.Residual
	var ruleErr error
	var at, wroteOn time.Time // wroteOn: the residual (its CreatedAt) the last written try appended to
	writeID := rand.Text()
	landed, err := l.retry(ctx, true, func(ctx context.Context, c *pgxpool.Conn, mayHaveLanded bool) error {
		err := l.locked(ctx, c, p.Namespace, p.Key, false, func(r *residual.Residual, _ *row, now time.Time) (*change, error) {
			out, ruleErr, at = r, nil, now
			if mayHaveLanded && ownEvidence(r, writeID) {
				return nil, nil
			}
			if mayHaveLanded && !r.CreatedAt.Equal(wroteOn) {
				out = nil
				return nil, fmt.Errorf("append evidence to key %s: the residual was collected and started afresh: %w", p.Key, errOwnWriteUnseen)
			}
			// Not landed: the same residual, which never drops an observation, lacks it.
			e := p.Evidence
			e.WriteID = writeID
			rules.ApplyEvidence(r, e, now)
			wroteOn = r.CreatedAt
			return &change{r: r}, nil
		})
		if errors.Is(err, errMissing) {
			if mayHaveLanded {
				out, ruleErr = nil, nil
				return fmt.Errorf("append evidence to key %s: the residual is gone: %w", p.Key, errOwnWriteUnseen)
			}
			out, ruleErr = nil, fmt.Errorf("%w: append evidence to key %s in namespace %q", residual.ErrNotFound, p.Key, p.Namespace)
			return nil
		}
		return err
	})
	if err != nil {
		return nil, l.fail("append evidence of key "+p.Key, landed, err)
	}
	if out != nil {
		out.State = out.EffectiveState(at)
	}
	return out, ruleErr
}
