package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolfence/toolfence/ledger"
)

// failure classifies a failed try of a ledger step.
type failure int

const (
	succeeded failure = iota
	// final: the server refused the statement (its transaction rolled back) or the result
	// could not be used; trying again would not help.
	final
	// notSent: the connection failed before the statement reached the server; nothing
	// was written and the step may be tried again.
	notSent
	// ambiguous: the connection broke after the statement was sent; it may have been
	// committed. Only re-reading what is stored can tell.
	ambiguous
)

// maxTries bounds the tries of one step; backoff holds the waits before each retry.
const maxTries = 5

var backoff = [maxTries]time.Duration{0, 0, 20 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond}

// try runs fn on one connection acquired under actx, with fn running under ctx, and
// classifies its failure. A broken connection is ambiguous unless pgx knows the statement
// was never sent.
//
// A non-zero deadline bounds fn on the connection itself (a socket deadline), so that the
// statements of a write can run under a context that is never cancelled, which pgx need not
// watch. When the deadline cuts a statement off, pgx closes the connection (its reply may
// still be on the way) and asks the server to cancel the statement; a connection that is
// still open afterwards gets its deadline cleared before it goes back to the pool, even when
// fn panics. A deadline that has passed by the time a connection is acquired runs nothing:
// the try is not sent, and the connection goes back untouched.
func (l *Ledger) try(actx, ctx context.Context, deadline time.Time, fn func(context.Context, *pgxpool.Conn) error) (failure, error) {
	c, err := l.pool.Acquire(actx)
	if err != nil {
		if l.closed.Load() {
			return final, err
		}
		return notSent, err
	}
	defer c.Release()
	pc := c.Conn().PgConn()
	if !deadline.IsZero() {
		if !time.Now().Before(deadline) {
			return notSent, fmt.Errorf("the write timeout passed before a connection was free: %w", context.DeadlineExceeded)
		}
		if err := pc.Conn().SetDeadline(deadline); err != nil {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			_ = pc.Close(cctx)
			cancel()
			return notSent, err
		}
		defer func() {
			if !pc.IsClosed() {
				_ = pc.Conn().SetDeadline(time.Time{})
			}
		}()
	}
	err = fn(ctx, c)
	switch {
	case err == nil:
		return succeeded, nil
	case pc.IsClosed() && errors.As(err, new(unwritten)):
		// The try broke where it provably wrote nothing: in a transaction before its
		// COMMIT was sent, or in a read after a write that wrote nothing.
		return notSent, err
	case pc.IsClosed():
		// pgx reports a write that failed as safe to retry. A read that failed after the
		// statement was sent can surface as "conn closed", which pgx also calls safe to
		// retry: that one is ambiguous.
		if pgconn.SafeToRetry(err) && !errors.Is(err, pgconn.ErrConnClosed) {
			return notSent, err
		}
		return ambiguous, err
	}
	return final, err
}

// retry runs fn until it succeeds, fails for good, or maxTries are used up, waiting a little
// between tries. fn learns (mayHaveLanded) that an earlier try broke after sending its
// write, so it must re-read what is stored before writing again; the returned
// mayHaveLanded says such a break happened.
//
// For a write, the statements run under a context that keeps ctx's values but not its
// cancellation, bounded by the write timeout (a deadline on the connection): a caller that
// gives up while a write is in flight never turns it into an ambiguous one, and a write that
// may have landed is re-read even when the caller has gone. Until something may have
// landed, the caller's ctx still ends the wait for a connection and the waits between
// tries; afterwards the write timeout does. No try starts once the write timeout has passed.
func (l *Ledger) retry(ctx context.Context, write bool, fn func(ctx context.Context, c *pgxpool.Conn, mayHaveLanded bool) error) (mayHaveLanded bool, err error) {
	return l.retryFrom(ctx, write, false, fn)
}

// retryFrom is retry for a write whose earlier try, made elsewhere (a shared statement of a
// group), may have landed: with landed set, fn's first try already gets mayHaveLanded, and
// the caller's ctx no longer ends anything (the write timeout does), as after a broken try.
func (l *Ledger) retryFrom(ctx context.Context, write, landed bool, fn func(ctx context.Context, c *pgxpool.Conn, mayHaveLanded bool) error) (mayHaveLanded bool, err error) {
	landed = landed && write
	if err := ctx.Err(); err != nil && !landed {
		return false, err
	}
	run, landedWait := ctx, ctx
	var deadline time.Time
	if write {
		run = context.WithoutCancel(ctx)
		deadline = time.Now().Add(l.writeTimeout)
	}
	if landed {
		var cancel context.CancelFunc
		landedWait, cancel = context.WithDeadline(run, deadline)
		defer cancel()
		mayHaveLanded = true
	}
	for n := 0; ; n++ {
		wait := ctx
		if mayHaveLanded {
			wait = landedWait
		}
		f, err := l.try(wait, run, deadline, func(ctx context.Context, c *pgxpool.Conn) error { return fn(ctx, c, mayHaveLanded) })
		switch f {
		case succeeded:
			if write && mayHaveLanded {
				return true, l.barrier(run, deadline)
			}
			return mayHaveLanded, nil
		case final:
			return mayHaveLanded, err
		case ambiguous:
			if !mayHaveLanded && write {
				var cancel context.CancelFunc
				landedWait, cancel = context.WithDeadline(run, deadline)
				defer cancel()
			}
			mayHaveLanded = true
			wait = landedWait
		}
		if n+1 >= maxTries || l.closed.Load() || wait.Err() != nil || write && !time.Now().Before(deadline) {
			return mayHaveLanded, errors.Join(err, wait.Err())
		}
		if d := backoff[n+1]; d > 0 {
			select {
			case <-wait.Done():
				return mayHaveLanded, errors.Join(err, wait.Err())
			case <-l.clock.After(d):
			}
		}
	}
}

// barrierSQL writes one WAL record in a transaction of its own (a transactional logical
// message, which every role may emit and no table keeps), so that its commit waits, like
// every write of the ledger, for the flush and the synchronous standbys. A transaction that
// only takes an id (pg_current_xact_id()) would not: PostgreSQL commits a transaction that
// wrote no WAL before its commit record asynchronously.
const barrierSQL = `SELECT pg_logical_emit_message(true, 'toolfence', 'barrier')`

// barrier returns once everything committed before it is durable: flushed, and received
// by the synchronous standbys there are. A retry after a broken write needs it before it
// answers: a commit whose session was terminated while it waited for its synchronous
// standby has committed locally and is visible to the re-read, though the standby may never
// get it (PostgreSQL warns "the transaction has already committed locally, but might not
// have been replicated to the standby"). Its own commit record comes after that write's, so
// once it is replicated, so is the write. It runs only on that path, never on a clean write.
func (l *Ledger) barrier(ctx context.Context, deadline time.Time) error {
	_, err := l.try(ctx, ctx, deadline, func(ctx context.Context, c *pgxpool.Conn) error {
		_, err := c.Exec(ctx, barrierSQL)
		return err
	})
	if err != nil {
		return fmt.Errorf("the write landed, but waiting until it is durable on the synchronous standbys failed: %w", err)
	}
	return nil
}

// unwritten wraps the error of a try that provably wrote nothing, however the connection
// failed: a transaction that broke before its COMMIT was sent, or a read after a write
// statement that answered that it wrote nothing. try classifies such a break as notSent, not
// ambiguous.
type unwritten struct{ err error }

func (u unwritten) Error() string { return u.err.Error() }
func (u unwritten) Unwrap() error { return u.err }

// noWrite wraps err (when not nil) as unwritten.
func noWrite(err error) error {
	if err == nil {
		return nil
	}
	return unwritten{err}
}

// errOwnWriteUnseen is returned by a retry that may follow a landed write, when the key has
// moved on so that the write, if it landed, left no trace the retry can recognise (another
// attempt took the key, GC collected the residual, the attempt was trimmed) and nothing
// proves that it did not land. Judging the step afresh would answer for a write that may
// have happened, so fail turns it into an error wrapping ledger.ErrOutcomeUnknown.
var errOwnWriteUnseen = errors.New("the key moved on before the retry, and whether this write landed cannot be told from what is stored")

// fail wraps an infrastructure failure of what (an operation and its subject):
// ledger.ErrOutcomeUnknown when a write may have landed and could not be re-read or
// recognised (errOwnWriteUnseen), ledger.ErrUnavailable
// when the server could not be reached, and the server's error otherwise.
func (l *Ledger) fail(what string, mayHaveLanded bool, err error) error {
	switch {
	case errors.Is(err, errOwnWriteUnseen):
		return fmt.Errorf("%w: %s on %s: the connection broke after the write was sent; %w",
			ledger.ErrOutcomeUnknown, what, l.target, err)
	case mayHaveLanded:
		return fmt.Errorf("%w: %s on %s: the connection broke after the write was sent and what is stored could not be re-read: %w",
			ledger.ErrOutcomeUnknown, what, l.target, err)
	case isConnError(err):
		return fmt.Errorf("postgres: %s on %s: %w: %w", what, l.target, ledger.ErrUnavailable, err)
	}
	return fmt.Errorf("postgres: %s on %s: %w", what, l.target, err)
}

// isConnError reports whether err is a connection failure rather than a server's refusal.
func isConnError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC" || len(pgErr.Code) == 5 && (pgErr.Code[:2] == "08" || pgErr.Code[:3] == "57P")
	}
	var ce *pgconn.ConnectError
	return errors.As(err, &ce) || pgconn.SafeToRetry(err) || pgconn.Timeout(err)
}
