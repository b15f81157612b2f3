package badger

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	dbadger "github.com/dgraph-io/badger/v4"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/rules"
	"github.com/toolfence/toolfence/residual"
)

// The filter index: for every residual, an empty entry under
//
//	"x/<namespace>\x00" + field + uint32 length of value (big-endian) + value + key
//
// for its task ('t'), operation ('o') and target ('g'), and, while its stored state is open
// (pending, unknown, accepted), under "x/<namespace>\x00p" + key. Each field's entries of one
// value are contiguous and in key order, so List walks (and intersects) the prefixes of the
// filters it was given instead of reading the namespace. Task, operation and target are fixed
// when a residual is created, so their entries are written once, in the transaction that
// creates it; the open entry follows the state in every transaction that writes the
// residual; GC deletes all of them with the residual. The value under indexVersionKey says
// the index is complete: Open builds it, once, for a store written before it existed.
const (
	indexPrefix     = "x/"
	indexVersionKey = "m/index"
	indexVersion    = "1"
)

// Index fields.
const (
	fieldTask      byte = 't'
	fieldOperation byte = 'o'
	fieldTarget    byte = 'g'
	fieldOpen      byte = 'p'
)

// fieldPrefix returns the prefix of the index entries of namespace ns whose field has value
// (value is ignored for fieldOpen).
func fieldPrefix(ns string, field byte, value string) []byte {
	b := storeKey(indexPrefix, ns, "")
	b = append(b, field)
	if field != fieldOpen {
		b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
		b = append(b, value...)
	}
	return b
}

// indexKey returns the index entry of key under prefix.
func indexKey(prefix []byte, key string) []byte {
	return append(append(make([]byte, 0, len(prefix)+len(key)), prefix...), key...)
}

// fixedPrefixes returns the prefixes of r's write-once entries (task, operation, target).
func fixedPrefixes(r *residual.Residual) [][]byte {
	return [][]byte{
		fieldPrefix(r.Namespace, fieldTask, r.Task),
		fieldPrefix(r.Namespace, fieldOperation, r.Operation),
		fieldPrefix(r.Namespace, fieldTarget, r.Target),
	}
}

// storedInfo is what a step's transaction read of one residual: whether it existed and
// whether its stored state was open.
type storedInfo struct{ exists, open bool }

// noteStored records what t read of the residual under store key k.
func (t *tx) noteStored(k []byte, info storedInfo) {
	if t.stored == nil {
		t.stored = map[string]storedInfo{}
	}
	t.stored[string(k)] = info
}

// indexResidual stages the index entries of r, about to be written under store key k: the
// task, operation and target entries when r is new (or was not read by t: then they are
// written again, which changes nothing), and the open entry when r's openness changed.
func indexResidual(t *tx, k []byte, r *residual.Residual) error {
	was, known := t.stored[string(k)]
	if !known || !was.exists {
		for _, p := range fixedPrefixes(r) {
			if err := t.set(indexKey(p, r.Key), nil); err != nil {
				return fmt.Errorf("badger: index residual %s: %w", r.Key, err)
			}
		}
	}
	open := r.State.Open()
	if !known || !was.exists || was.open != open {
		openKey := indexKey(fieldPrefix(r.Namespace, fieldOpen, ""), r.Key)
		var err error
		switch {
		case open:
			err = t.set(openKey, nil)
		case known && !was.exists:
			// Nothing to delete.
		default:
			err = t.txn.Delete(openKey)
		}
		if err != nil {
			return fmt.Errorf("badger: index residual %s: %w", r.Key, err)
		}
	}
	t.noteStored(k, storedInfo{exists: true, open: open})
	return nil
}

// unindexResidual stages the deletion of every index entry of r (GC).
func unindexResidual(t *tx, r *residual.Residual) error {
	for _, p := range append(fixedPrefixes(r), fieldPrefix(r.Namespace, fieldOpen, "")) {
		if err := t.txn.Delete(indexKey(p, r.Key)); err != nil {
			return fmt.Errorf("badger: unindex residual %s: %w", r.Key, err)
		}
	}
	return nil
}

// listPrefixes returns the index prefixes a listing with p's filters walks: one per set
// field, and the open entries when p asks for open states only. None means the listing
// reads the namespace.
func listPrefixes(p ledger.ListParams) [][]byte {
	var out [][]byte
	for _, f := range []struct {
		field byte
		value string
	}{{fieldTarget, p.Target}, {fieldTask, p.Task}, {fieldOperation, p.Operation}} {
		if f.value != "" {
			out = append(out, fieldPrefix(p.Namespace, f.field, f.value))
		}
	}
	open := len(p.States) > 0
	for _, s := range p.States {
		open = open && s.Open()
	}
	if open {
		out = append(out, fieldPrefix(p.Namespace, fieldOpen, ""))
	}
	return out
}

// listIndexed passes to add, in key order, the residuals whose keys are under every one of
// prefixes, past p.Cursor, that match p at now (each is re-checked against the residual
// itself), until add returns false or the index has no more. It intersects the prefixes by seeking each in turn to the
// highest key another one is at, so it reads only index entries near the matches.
func listIndexed(ctx context.Context, t *tx, p ledger.ListParams, prefixes [][]byte, now time.Time, add func(*residual.Residual) bool) error {
	its := make([]*dbadger.Iterator, len(prefixes))
	for i, pre := range prefixes {
		its[i] = t.txn.NewIterator(dbadger.IteratorOptions{Prefix: pre})
		defer its[i].Close()
	}
	lo := ""
	if p.Cursor != "" {
		lo = p.Cursor + "\x00" // the least key after the cursor
	}
	seek := make([]byte, 0, 128)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hi, agree := lo, true
		for i, it := range its {
			seek = append(append(seek[:0], prefixes[i]...), hi...)
			it.Seek(seek)
			if !it.ValidForPrefix(prefixes[i]) {
				return nil // this filter has nothing at or after hi: no more matches
			}
			k := it.Item().Key()[len(prefixes[i]):]
			if !bytes.Equal(k, []byte(hi)) {
				agree = false
				if string(k) > hi {
					hi = string(k)
				}
			}
		}
		if !agree {
			lo = hi
			continue
		}
		r, err := getResidual(t, p.Namespace, hi)
		switch {
		case errors.Is(err, residual.ErrNotFound):
			// An entry without its residual: skip it (the residual is the truth).
		case err != nil:
			return err
		default:
			r.State = r.EffectiveState(now)
			if rules.Matches(p, r) && !add(r) {
				return nil
			}
		}
		lo = hi + "\x00"
	}
}

// buildIndex makes the filter index complete: a store whose version marker is missing
// (written by a toolfence without the index, or whose build was interrupted) gets its index
// entries dropped and written again from its residuals, then the marker. It runs from Open
// before any step, so nothing else writes meanwhile.
func (l *Ledger) buildIndex() error {
	var done bool
	err := l.db.View(func(txn *dbadger.Txn) error {
		item, err := txn.Get([]byte(indexVersionKey))
		if errors.Is(err, dbadger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			switch string(v) {
			case indexVersion:
				done = true
				return nil
			}
			return fmt.Errorf("filter index version %q: this binary knows version %s; upgrade toolfence", v, indexVersion)
		})
	})
	if err != nil || done {
		if err != nil {
			err = fmt.Errorf("badger: open %s: %w", l.dir, err)
		}
		return err
	}
	wb := l.db.NewWriteBatch()
	defer wb.Cancel()
	// Entries of an interrupted build go first (deleting what is not there costs a marker).
	err = l.db.View(func(txn *dbadger.Txn) error {
		it := txn.NewIterator(dbadger.IteratorOptions{Prefix: []byte(indexPrefix)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if err := wb.Delete(it.Item().KeyCopy(nil)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("badger: open %s: clear the filter index: %w", l.dir, err)
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("badger: open %s: clear the filter index: %w", l.dir, err)
	}
	wb = l.db.NewWriteBatch()
	defer wb.Cancel()
	err = l.db.View(func(txn *dbadger.Txn) error {
		prefix := []byte(residualPrefix)
		it := txn.NewIterator(dbadger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 100})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			var r residual.Residual
			item := it.Item()
			if err := item.Value(func(v []byte) error { return json.Unmarshal(v, &r) }); err != nil {
				return fmt.Errorf("decode %q: %w", item.Key(), err)
			}
			prefixes := fixedPrefixes(&r)
			if r.State.Open() {
				prefixes = append(prefixes, fieldPrefix(r.Namespace, fieldOpen, ""))
			}
			for _, p := range prefixes {
				if err := wb.Set(indexKey(p, r.Key), nil); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err == nil {
		err = wb.Flush()
	}
	if err == nil {
		err = l.db.Update(func(txn *dbadger.Txn) error {
			return txn.Set([]byte(indexVersionKey), []byte(indexVersion))
		})
	}
	if err != nil {
		return fmt.Errorf("badger: open %s: build the filter index: %w", l.dir, err)
	}
	return nil
}
