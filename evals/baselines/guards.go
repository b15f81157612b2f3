package baselines

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// Request is one tool call as the baselines see it.
type Request struct {
	// Scope is the key scope a runtime would use: the task (agent run) and the tool.
	Task, Operation string
	// Target is the business identity of the call (the invoice, the message id).
	Target string
	// Args is the raw request body.
	Args []byte
}

// Call performs the side effect. key is what the guard would send as Idempotency-Key.
type Call func(ctx context.Context, key string) ([]byte, error)

// Guard runs calls under one baseline's idempotency rule. Implementations are safe for
// concurrent use (and share nothing but the FileStore across processes).
type Guard interface {
	// Name is the subject name in reports.
	Name() string
	// Do runs call under the rule. It returns the result (fresh or cached), an error
	// wrapping ErrConflict when another call holds the key (retry after RetryAfter), or
	// the call's or the store's error.
	Do(ctx context.Context, req Request, call Call) ([]byte, error)
}

// ErrConflict is returned when a pending record holds the key ("429, retry later").
var ErrConflict = errors.New("baselines: a pending request holds the key")

// ConflictError carries how long to wait; it wraps ErrConflict.
type ConflictError struct {
	Key        string
	RetryAfter time.Duration
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("baselines: key %s is pending; retry after %v", e.Key, e.RetryAfter)
}

// Unwrap returns ErrConflict.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// None is no guard: every call runs.
type None struct{}

// Name returns "none".
func (None) Name() string { return "none" }

// Do runs call.
func (None) Do(ctx context.Context, req Request, call Call) ([]byte, error) {
	return call(ctx, "")
}

// clock returns now, or time.Now when it is nil.
func clock(now func() time.Time) func() time.Time {
	if now == nil {
		return time.Now
	}
	return now
}

// intentKey is the key a careful runtime derives from the intent (task, tool, target).
func intentKey(req Request) string {
	sum := sha256.Sum256([]byte(req.Task + "\x00" + req.Operation + "\x00" + req.Target))
	return "k_" + hex.EncodeToString(sum[:16])
}

// RecordAfter writes the record only after the call returns (the common guard that records
// a completed call's result):
// a completed record is replayed; anything else runs the call. A crash between the effect
// and the record leaves no trace, so the retry runs the call again. Store errors on the
// check are ignored (fail open), as guards that treat the store as an optimisation do.
type RecordAfter struct{ Store FileStore }

// Name returns "record-after".
func (RecordAfter) Name() string { return "record-after" }

// Do replays a completed record or runs call and records its result.
func (g RecordAfter) Do(ctx context.Context, req Request, call Call) ([]byte, error) {
	key := intentKey(req)
	if r, err := g.Store.Get(key); err == nil && r != nil && r.Status == StatusCompleted {
		return r.Result, nil
	}
	res, err := call(ctx, key)
	if err != nil {
		return nil, err
	}
	_ = g.Store.Put(Record{Key: key, Status: StatusCompleted, Result: res}) // fail open
	return res, nil
}

// CheckThenInsert is the usual idempotency middleware pattern: the key hashes method, path and
// str(body) (so re-worded args make a new key), it checks the store, writes a pending
// record without any unique constraint (last writer wins), runs the call, and marks the
// record failed on an error (the next call resets it and runs again) or completed. A
// pending record "must never block indefinitely": it expires after TTL and the call re-runs.
type CheckThenInsert struct {
	Store FileStore
	// TTL of a pending record. Required.
	TTL time.Duration
	// Now reads the clock that stamps and expires pending records. Defaults to time.Now.
	Now func() time.Time
}

// Name returns "check-then-insert".
func (CheckThenInsert) Name() string { return "check-then-insert" }

// Do runs call under the middleware's rule.
func (g CheckThenInsert) Do(ctx context.Context, req Request, call Call) ([]byte, error) {
	body := sha256.Sum256(req.Args)
	sum := sha256.Sum256([]byte("POST:" + req.Operation + ":" + req.Task + ":" + hex.EncodeToString(body[:8])))
	key := "idem_" + hex.EncodeToString(sum[:16])
	now := clock(g.Now)
	existing, err := g.Store.Get(key)
	if err != nil {
		existing = nil // the store is an optimisation: fail open
	}
	if existing != nil {
		switch {
		case existing.Status == StatusCompleted:
			return existing.Result, nil
		case existing.Status == StatusFailed:
			existing = nil // "allow retry on previous failure"
		case now().After(existing.Expires):
			existing = nil // a stale pending must not block forever
		default:
			return nil, &ConflictError{Key: key, RetryAfter: existing.Expires.Sub(now())}
		}
	}
	_ = g.Store.Put(Record{Key: key, Status: StatusPending, Expires: now().Add(g.TTL)})
	res, err := call(ctx, key)
	if err != nil {
		_ = g.Store.Put(Record{Key: key, Status: StatusFailed})
		return nil, err
	}
	_ = g.Store.Put(Record{Key: key, Status: StatusCompleted, Result: res})
	return res, nil
}

// ExpiringInProgress is the common library behaviour: the key comes from the intent, an
// in-progress record is written before the call and expires after TTL, after which the
// call runs again; an error deletes the record so the call can be retried; a completed
// record is replayed. Writes are not fenced: a late holder overwrites whatever is there.
type ExpiringInProgress struct {
	Store FileStore
	// TTL of the in-progress record. Required.
	TTL time.Duration
	// Now reads the clock that stamps and expires in-progress records. Defaults to time.Now.
	Now func() time.Time
}

// Name returns "expiring-in-progress".
func (ExpiringInProgress) Name() string { return "expiring-in-progress" }

// Do runs call under the rule.
func (g ExpiringInProgress) Do(ctx context.Context, req Request, call Call) ([]byte, error) {
	key := intentKey(req)
	now := clock(g.Now)
	r, err := g.Store.Get(key)
	if err != nil {
		return nil, err // this one fails closed on a store it cannot read
	}
	if r != nil {
		switch {
		case r.Status == StatusCompleted:
			return r.Result, nil
		case r.Status == StatusPending && now().Before(r.Expires):
			return nil, &ConflictError{Key: key, RetryAfter: r.Expires.Sub(now())}
		}
	}
	if err := g.Store.Put(Record{Key: key, Status: StatusPending, Expires: now().Add(g.TTL)}); err != nil {
		return nil, err
	}
	res, err := call(ctx, key)
	if err != nil {
		_ = g.Store.Delete(key)
		return nil, err
	}
	if err := g.Store.Put(Record{Key: key, Status: StatusCompleted, Result: res}); err != nil {
		return nil, err
	}
	return res, nil
}

// MarkBefore records the key as done before it runs the call, like deduplicators that mark
// a message seen and then run the handler: any later call with the key is treated as done
// and gets whatever result is stored (none, if the first call never finished), and a
// failed call is never retried. The key comes from the intent.
type MarkBefore struct{ Store FileStore }

// Name returns "mark-before".
func (MarkBefore) Name() string { return "mark-before" }

// Do returns the stored result of a seen key, or marks the key and runs call.
func (g MarkBefore) Do(ctx context.Context, req Request, call Call) ([]byte, error) {
	key := intentKey(req)
	if r, err := g.Store.Get(key); err == nil && r != nil {
		return r.Result, nil // seen: a duplicate, "already processed"
	}
	_ = g.Store.Put(Record{Key: key, Status: StatusCompleted}) // fail open
	res, err := call(ctx, key)
	if err != nil {
		return nil, err
	}
	_ = g.Store.Put(Record{Key: key, Status: StatusCompleted, Result: res})
	return res, nil
}
