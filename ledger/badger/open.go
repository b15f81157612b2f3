package badger

import (
	"context"
	"fmt"
	"sync"
	"time"

	dbadger "github.com/dgraph-io/badger/v4"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

var (
	_ ledger.OpenCounter = (*Ledger)(nil)
	_ ledger.Describer   = (*Ledger)(nil)
)

// Describe implements ledger.Describer: system "badger", the store's directory as the
// namespace.
func (l *Ledger) Describe() ledger.Description {
	return ledger.Description{System: "badger", Namespace: l.dir}
}

// openEntry is what the open index keeps of one open residual: its recorded state, the
// current attempt's lease and start, and its version (token, then settled after pending),
// so an older write applied late never replaces a newer one.
type openEntry struct {
	state   residual.State
	expires time.Time
	started time.Time
	token   uint64
	rank    int // 0 pending, 1 otherwise
}

// openIndex is an in-memory index of the open residuals (pending, unknown, accepted) of
// every namespace, built by one scan on first use and kept up to date by every committed
// write after that; OpenResiduals reads it without touching the store. One process has a
// badger store open at a time, so the index sees every write.
type openIndex struct {
	mu    sync.Mutex
	built bool
	m     map[string]openEntry // store key → entry
	// gone and goneOld hold versions of residuals that left the index, so the note of an
	// older write applied late (a goroutine's note can trail the next commit on the key)
	// does not bring them back. They rotate every goneFor, so memory stays bounded.
	gone, goneOld map[string]openEntry
	rotated       time.Time
}

// goneFor is how long the index remembers a residual that left it.
const goneFor = time.Minute

func entryOf(r *residual.Residual) openEntry {
	e := openEntry{state: r.State, token: r.Token, rank: 1}
	if r.State == residual.Pending {
		e.rank = 0
	}
	if a := r.Current(); a != nil {
		e.expires, e.started = a.LeaseExpires, a.Started
		if a.Outcome != residual.None || a.Released {
			e.expires = time.Time{} // a pending whose attempt ended reads as unknown
		}
	}
	return e
}

func (e openEntry) newer(o openEntry) bool {
	return e.token > o.token || e.token == o.token && e.rank >= o.rank
}

// note records the residuals a committed transaction wrote (nil for a deleted key).
// Before the first OpenResiduals it does nothing.
func (x *openIndex) note(writes map[string]*openEntry) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.built {
		return
	}
	if now := time.Now(); now.Sub(x.rotated) > goneFor {
		x.goneOld, x.gone, x.rotated = x.gone, map[string]openEntry{}, now
	}
	for k, r := range writes {
		if r == nil {
			delete(x.m, k)
			delete(x.gone, k)
			delete(x.goneOld, k)
			continue
		}
		x.put(k, *r)
	}
}

func (x *openIndex) put(k string, e openEntry) {
	for _, m := range []map[string]openEntry{x.m, x.gone, x.goneOld} {
		if old, ok := m[k]; ok && !e.newer(old) {
			return
		}
	}
	switch e.state {
	case residual.Pending, residual.Unknown, residual.Accepted:
		x.m[k] = e
		delete(x.gone, k)
	default:
		delete(x.m, k)
		x.gone[k] = e
	}
}

// OpenResiduals implements ledger.OpenCounter from the in-memory index. The first call
// builds the index with one scan of the store; later calls cost one pass over the open
// residuals only.
func (l *Ledger) OpenResiduals(ctx context.Context) ([]ledger.OpenCount, error) {
	x := &l.open
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.built {
		x.m, x.gone, x.goneOld, x.rotated = map[string]openEntry{}, map[string]openEntry{}, map[string]openEntry{}, time.Now()
		err := l.view(ctx, func(t *tx, _ time.Time) error {
			prefix := []byte(residualPrefix)
			it := t.txn.NewIterator(dbadger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 100})
			defer it.Close()
			for it.Rewind(); it.ValidForPrefix(prefix); it.Next() {
				var r residual.Residual
				if err := decodeItem(t, it.Item(), string(it.Item().Key()), &r); err != nil {
					return err
				}
				x.put(string(it.Item().KeyCopy(nil)), entryOf(&r))
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("badger: open residuals: %w", err)
		}
		x.built = true
	}
	now := l.now()
	out := []ledger.OpenCount{{State: residual.Pending}, {State: residual.Unknown}, {State: residual.Accepted}}
	for _, e := range x.m {
		i := 2
		switch {
		case e.state == residual.Pending && e.expires.After(now):
			i = 0
		case e.state == residual.Pending, e.state == residual.Unknown:
			i = 1
		}
		c := &out[i]
		c.Count++
		if c.Oldest.IsZero() || e.started.Before(c.Oldest) {
			c.Oldest = e.started
		}
	}
	return out, nil
}
