package badger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	dbadger "github.com/dgraph-io/badger/v4"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/rules"
	"github.com/toolfence/toolfence/residual"
)

// Reserve implements ledger.Ledger. Every decision but Acquired is answered from a
// read-only transaction, or from the replay cache for a succeeded key (reserveRead);
// Acquired is only ever decided, again, in the read-write transaction that writes it.
// Concurrent reserves of one key serialise through badger's optimistic conflict detection:
// both read the key, one commits, the other conflicts, retries and sees the winner's
// pending residual.
func (l *Ledger) Reserve(ctx context.Context, p ledger.ReserveParams) (*ledger.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	res, err := l.reserveRead(ctx, p)
	if err != nil || res != nil {
		return res, err
	}
	err = l.update(ctx, "reserve", func(t *tx, now time.Time) (bool, error) {
		r, err := findResidual(t, p.Namespace, p.Key)
		if err != nil {
			return false, err
		}
		if d := rules.Decide(r, p, now); d != ledger.Acquired {
			// Someone else's write landed since the read-only try. Write nothing; update
			// answers once what was read is durable.
			r.State = r.EffectiveState(now)
			res = &ledger.ReserveResult{Decision: d, Residual: r}
			return false, nil
		}
		token, err := nextToken(t, p.Namespace, p.Key, r)
		if err != nil {
			return false, err
		}
		d, r, ls := rules.ApplyReserve(r, p, token, now)
		res = &ledger.ReserveResult{Decision: d, Residual: r, Lease: ls}
		if d != ledger.Acquired {
			return false, nil // unreachable (same rule, same inputs); write nothing
		}
		if err := putResidual(t, r); err != nil {
			return false, err // commit nothing, not even the token bump
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if res.Decision == ledger.Acquired {
		l.hub.publish(ledger.Change{Namespace: p.Namespace, Key: p.Key, State: residual.Pending})
	}
	return res, nil
}

// reserveRead is Reserve's read-only first try. It returns the answer for every decision
// but Acquired, once what it read is durable, and nil, nil when the key is free: only the
// read-write transaction may reserve, and it decides again. A succeeded residual comes from
// the replay cache when there, and is added to it when read.
func (l *Ledger) reserveRead(ctx context.Context, p ledger.ReserveParams) (*ledger.ReserveResult, error) {
	ck := string(storeKey(residualPrefix, p.Namespace, p.Key))
	release, err := l.enter()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		release()
		return nil, err
	}
	cached, now := l.cache.get(ck), l.now()
	release()
	if cached != nil {
		d := rules.Decide(cached, p, now) // Replay or PayloadMismatch, or Acquired by Supersede
		if d == ledger.Acquired {
			return nil, nil // only the read-write transaction may reserve
		}
		r := cached.Clone()
		r.State = r.EffectiveState(now)
		return &ledger.ReserveResult{Decision: d, Residual: r}, nil
	}

	stamp := l.cache.stamp(ck) // before the read transaction opens; see replayCache
	var res *ledger.ReserveResult
	var fill *residual.Residual
	var fillLen int
	err = l.view(ctx, func(t *tx, now time.Time) error {
		r, n, err := readResidual(t, p.Namespace, p.Key)
		if errors.Is(err, residual.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		d := rules.Decide(r, p, now)
		if d == ledger.Acquired {
			t.read = 0 // no answer given from this read: the write path covers it
			return nil
		}
		if r.State == residual.Succeeded {
			fill, fillLen = r.Clone(), n
		}
		r.State = r.EffectiveState(now)
		res = &ledger.ReserveResult{Decision: d, Residual: r}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if fill != nil {
		l.cache.add(ck, fill, fillLen, stamp) // durable: view waited for it
	}
	return res, nil
}

// Commit implements ledger.Ledger. A refused commit still writes its evidence, durably,
// and returns the stored residual with an error wrapping residual.ErrLeaseLost; a commit of
// a missing residual returns no residual and an error wrapping residual.ErrLeaseLost and
// residual.ErrNotFound. An
// identical retry of a commit that landed (rules.Recorded) writes nothing and returns the
// stored residual.
func (l *Ledger) Commit(ctx context.Context, p ledger.CommitParams) (*residual.Residual, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var out *residual.Residual
	var fenceErr error
	var wrote bool
	err := l.update(ctx, "commit", func(t *tx, now time.Time) (bool, error) {
		out, fenceErr = nil, nil
		r, err := getResidual(t, p.Namespace, p.Key)
		if errors.Is(err, residual.ErrNotFound) {
			// No residual, no fence (never reserved, or collected after the lease was lost):
			// refused like any lost fence, with nothing to record the evidence on.
			return false, fmt.Errorf("%w: commit: %w", residual.ErrLeaseLost, err)
		}
		if err != nil {
			return false, err
		}
		// ApplyCommit settles r or appends evidence, both written, or finds p already
		// recorded: then nothing is written and update answers once what was read is durable.
		write, ferr := rules.ApplyCommit(r, p, now)
		fenceErr = ferr
		if write {
			if err := putResidual(t, r); err != nil {
				return false, err
			}
		}
		out = r
		out.State = r.EffectiveState(now)
		wrote = write
		return write, fenceErr
	})
	// Only a durable answer returns the residual: err is then nil or the fence's own error.
	if out == nil || err != fenceErr {
		return nil, err
	}
	if wrote {
		l.hub.publish(ledger.Change{Namespace: p.Namespace, Key: p.Key, State: out.State})
	}
	return out, err
}

// Renew implements ledger.Ledger. A renewal of a missing residual returns an error
// wrapping residual.ErrLeaseLost and residual.ErrNotFound.
func (l *Ledger) Renew(ctx context.Context, p ledger.RenewParams) (lease.Lease, error) {
	if err := p.Validate(); err != nil {
		return lease.Lease{}, err
	}
	var out lease.Lease
	err := l.update(ctx, "renew", func(t *tx, now time.Time) (bool, error) {
		r, err := getResidual(t, p.Namespace, p.Key)
		if errors.Is(err, residual.ErrNotFound) {
			return false, fmt.Errorf("%w: renew: %w", residual.ErrLeaseLost, err)
		}
		if err != nil {
			return false, err
		}
		if out, err = rules.ApplyRenew(r, p, now); err != nil {
			return false, err
		}
		if err := putResidual(t, r); err != nil {
			return false, err // commit nothing, not even the token bump
		}
		return true, nil
	})
	if err != nil {
		return lease.Lease{}, err
	}
	return out, nil
}

// Resolve implements ledger.Ledger. The new fencing token comes from the key's counter, so
// it is higher than any token issued before, collected or not.
func (l *Ledger) Resolve(ctx context.Context, p ledger.ResolveParams) (*residual.Residual, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var out *residual.Residual
	err := l.update(ctx, "resolve", func(t *tx, now time.Time) (bool, error) {
		r, err := getResidual(t, p.Namespace, p.Key)
		if err != nil {
			return false, err
		}
		token, err := nextToken(t, p.Namespace, p.Key, r)
		if err != nil {
			return false, err
		}
		if err := rules.ApplyResolve(r, p, token, now); err != nil {
			return false, err
		}
		out = r
		if err := putResidual(t, r); err != nil {
			return false, err // commit nothing, not even the token bump
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	l.hub.publish(ledger.Change{Namespace: p.Namespace, Key: p.Key, State: out.State})
	return out, nil
}

// AppendEvidence implements ledger.Ledger. An evidence without a time is stamped with the
// ledger's clock.
func (l *Ledger) AppendEvidence(ctx context.Context, p ledger.EvidenceParams) (*residual.Residual, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var out *residual.Residual
	err := l.update(ctx, "append evidence", func(t *tx, now time.Time) (bool, error) {
		r, err := getResidual(t, p.Namespace, p.Key)
		if err != nil {
			return false, err
		}
		rules.ApplyEvidence(r, p.Evidence, now)
		if err := putResidual(t, r); err != nil {
			return false, err
		}
		out = r
		out.State = r.EffectiveState(now)
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	l.hub.publish(ledger.Change{Namespace: p.Namespace, Key: p.Key, State: out.State})
	return out, nil
}

// Get implements ledger.Ledger.
func (l *Ledger) Get(ctx context.Context, p ledger.GetParams) (*residual.Residual, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var out *residual.Residual
	err := l.view(ctx, func(t *tx, now time.Time) error {
		r, err := getResidual(t, p.Namespace, p.Key)
		if err != nil {
			return err
		}
		r.State = r.EffectiveState(now)
		out = r
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// List implements ledger.Ledger. With a task, operation or target, or with open states
// only, it walks the filter index (listIndexed, see index.go) and reads only the residuals
// the index names; otherwise it scans the namespace in key order from the cursor. Either way
// it filters on the effective state and reads one match past the page to tell whether a
// next page exists. The cursor is the last key of the page; a page never repeats it.
func (l *Ledger) List(ctx context.Context, p ledger.ListParams) (*ledger.Page, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	limit := rules.PageLimit(p.Limit)
	page := &ledger.Page{Residuals: []*residual.Residual{}}
	// add takes one match and reports whether the listing goes on.
	add := func(r *residual.Residual) bool {
		if len(page.Residuals) == limit {
			page.NextCursor = page.Residuals[limit-1].Key
			return false
		}
		page.Residuals = append(page.Residuals, r)
		return true
	}
	err := l.view(ctx, func(t *tx, now time.Time) error {
		page.Residuals, page.NextCursor = page.Residuals[:0], ""
		if prefixes := listPrefixes(p); len(prefixes) > 0 {
			return listIndexed(ctx, t, p, prefixes, now, add)
		}
		prefix := nsPrefix(p.Namespace)
		it := t.txn.NewIterator(dbadger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: min(limit+1, 100)})
		defer it.Close()
		seek := append(append([]byte(nil), prefix...), p.Cursor...)
		for it.Seek(seek); it.ValidForPrefix(prefix); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			item := it.Item()
			key := string(item.Key()[len(prefix):])
			if key <= p.Cursor {
				continue
			}
			var r residual.Residual
			if err := decodeItem(t, item, key, &r); err != nil {
				return err
			}
			r.State = r.EffectiveState(now)
			if rules.Matches(p, &r) && !add(&r) {
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return page, nil
}

// gcBatch bounds the deletions of one GC transaction.
const gcBatch = 256

// GC implements ledger.Ledger. It scans for candidates in a read transaction, then deletes
// them in batches of read-write transactions that re-read and re-check each candidate, so
// a residual reserved again meanwhile is kept (or the batch conflicts and is retried).
func (l *Ledger) GC(ctx context.Context, p ledger.GCParams) (ledger.GCResult, error) {
	if err := p.Validate(); err != nil {
		return ledger.GCResult{}, err
	}
	collectable := func(r *residual.Residual) bool {
		return r.State.Terminal() && r.UpdatedAt.Before(p.Before)
	}
	prefix := []byte(residualPrefix)
	if p.Namespace != "" {
		prefix = nsPrefix(p.Namespace)
	}
	var candidates [][]byte
	err := l.view(ctx, func(t *tx, _ time.Time) error {
		// Candidates only: decoded without noting versions, since GC answers nothing from
		// this read (each deletion re-checks its candidate and is synced).
		it := t.txn.NewIterator(dbadger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 100})
		defer it.Close()
		for it.Rewind(); it.ValidForPrefix(prefix); it.Next() {
			var r residual.Residual
			item := it.Item()
			if err := item.Value(func(v []byte) error { return json.Unmarshal(v, &r) }); err != nil {
				return fmt.Errorf("badger: decode %q: %w", item.Key(), err)
			}
			if collectable(&r) {
				candidates = append(candidates, item.KeyCopy(nil))
			}
		}
		return nil
	})
	if err != nil {
		return ledger.GCResult{}, err
	}
	var res ledger.GCResult
	for len(candidates) > 0 {
		batch := candidates[:min(gcBatch, len(candidates))]
		candidates = candidates[len(batch):]
		deleted := 0
		err := l.update(ctx, "gc", func(t *tx, _ time.Time) (bool, error) {
			deleted = 0
			for _, k := range batch {
				item, err := t.txn.Get(k)
				if errors.Is(err, dbadger.ErrKeyNotFound) {
					continue
				}
				if err != nil {
					return false, fmt.Errorf("badger: gc read %q: %w", k, err)
				}
				var r residual.Residual
				if err := item.Value(func(v []byte) error { return json.Unmarshal(v, &r) }); err != nil {
					return false, fmt.Errorf("badger: decode %q: %w", k, err)
				}
				if !collectable(&r) {
					continue
				}
				if err := t.del(k); err != nil {
					return false, fmt.Errorf("badger: gc delete %q: %w", k, err)
				}
				if err := unindexResidual(t, &r); err != nil {
					return false, err
				}
				deleted++
			}
			return deleted > 0, nil
		})
		if err != nil {
			return res, err
		}
		res.Deleted += deleted
	}
	return res, nil
}
