package baselines

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Record is what a baseline stores per key.
type Record struct {
	Key    string `json:"key"`
	Status string `json:"status"` // pending, completed, failed
	Result []byte `json:"result,omitempty"`
	// Expires is when a pending record stops counting (zero: never).
	Expires time.Time `json:"expires,omitzero"`
}

// Record statuses.
const (
	StatusPending   = "pending"
	StatusCompleted = "completed"
	StatusFailed    = "failed"
)

// ErrStoreUnavailable wraps every error of a FileStore that cannot read or write.
var ErrStoreUnavailable = errors.New("baselines: store unavailable")

// FileStore is the store the baselines share across processes: one JSON file per key in a
// directory, written with write-to-temp-then-rename. It has no locking and no unique
// constraint, like the key-value stores such middleware usually runs on: Get then Put is a
// check-then-write race, on purpose.
type FileStore struct {
	Dir string
}

func (s FileStore) path(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(s.Dir, hex.EncodeToString(sum[:16])+".json")
}

// Get returns the record of key, or nil (and no error) when there is none. It returns an
// error wrapping ErrStoreUnavailable when the store cannot be read.
func (s FileStore) Get(key string) (*Record, error) {
	b, err := os.ReadFile(s.path(key))
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(s.Dir); serr != nil {
			return nil, fmt.Errorf("%w: %w", ErrStoreUnavailable, serr)
		}
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrStoreUnavailable, key, err)
	}
	return &r, nil
}

// Put writes r (last writer wins) and fsyncs it. It returns an error wrapping
// ErrStoreUnavailable when the store cannot be written.
func (s FileStore) Put(r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	fail := func(err error) error { return fmt.Errorf("%w: %w", ErrStoreUnavailable, err) }
	f, err := os.CreateTemp(s.Dir, ".tmp-*")
	if err != nil {
		return fail(err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return fail(err)
	}
	if err := os.Rename(f.Name(), s.path(r.Key)); err != nil {
		return fail(err)
	}
	return nil
}

// Delete removes the record of key; a missing record is not an error.
func (s FileStore) Delete(key string) error {
	if err := os.Remove(s.path(key)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	return nil
}
