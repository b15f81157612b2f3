package baselines

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type counter struct{ n int }

func (c *counter) call(err error) Call {
	return func(context.Context, string) ([]byte, error) {
		c.n++
		if err != nil {
			return nil, err
		}
		return fmt.Appendf(nil, "r%d", c.n), nil
	}
}

func req(args string) Request {
	return Request{Task: "t", Operation: "charge", Target: "inv-1", Args: []byte(args)}
}

func TestGuardsReplayACompletedCall(t *testing.T) {
	t.Parallel()
	for _, g := range []Guard{
		RecordAfter{Store: FileStore{Dir: t.TempDir()}},
		CheckThenInsert{Store: FileStore{Dir: t.TempDir()}, TTL: time.Minute},
		ExpiringInProgress{Store: FileStore{Dir: t.TempDir()}, TTL: time.Minute},
	} {
		t.Run(g.Name(), func(t *testing.T) {
			var c counter
			for range 3 {
				res, err := g.Do(t.Context(), req(`{"a":1}`), c.call(nil))
				require.NoError(t, err)
				require.Equal(t, "r1", string(res))
			}
			require.Equal(t, 1, c.n)
		})
	}
}

func TestNoneRunsEveryCall(t *testing.T) {
	t.Parallel()
	var c counter
	for range 3 {
		_, err := None{}.Do(t.Context(), req(`{}`), c.call(nil))
		require.NoError(t, err)
	}
	require.Equal(t, 3, c.n)
}

func TestCheckThenInsertKeysOnTheBody(t *testing.T) {
	t.Parallel()
	g := CheckThenInsert{Store: FileStore{Dir: t.TempDir()}, TTL: time.Minute}
	var c counter
	_, err := g.Do(t.Context(), req(`{"text":"a"}`), c.call(nil))
	require.NoError(t, err)
	_, err = g.Do(t.Context(), req(`{"text":"b"}`), c.call(nil))
	require.NoError(t, err)
	require.Equal(t, 2, c.n, "re-worded args make a new key (seed 003's str(body) hash)")
}

// fakeClock is a clock that moves only when the test says so.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// A pending record blocks the key with a ConflictError for exactly its TTL, by the guard's
// clock, and the call runs again once it has expired. The clock is a fake: a slow machine
// (fsyncs, -race) cannot let the record expire before the second call looks at it.
func TestPendingBlocksUntilItExpires(t *testing.T) {
	t.Parallel()
	const ttl = 50 * time.Millisecond
	for _, mk := range []func(FileStore, func() time.Time) Guard{
		func(s FileStore, now func() time.Time) Guard { return CheckThenInsert{Store: s, TTL: ttl, Now: now} },
		func(s FileStore, now func() time.Time) Guard { return ExpiringInProgress{Store: s, TTL: ttl, Now: now} },
	} {
		clock := &fakeClock{now: time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)}
		g := mk(FileStore{Dir: t.TempDir()}, clock.Now)
		t.Run(g.Name(), func(t *testing.T) {
			hold := make(chan struct{})
			inside := make(chan struct{})
			first := make(chan error, 1)
			go func() {
				_, err := g.Do(context.Background(), req(`{}`), func(context.Context, string) ([]byte, error) {
					close(inside)
					<-hold
					return []byte("late"), nil
				})
				first <- err
			}()
			<-inside
			var c counter
			_, err := g.Do(t.Context(), req(`{}`), c.call(nil))
			var ce *ConflictError
			require.ErrorAs(t, err, &ce)
			require.ErrorIs(t, err, ErrConflict)
			require.Equal(t, ttl, ce.RetryAfter, "the clock has not moved: the whole TTL is left")

			clock.advance(ttl - time.Nanosecond)
			_, err = g.Do(t.Context(), req(`{}`), c.call(nil))
			require.ErrorAs(t, err, &ce, "one nanosecond before expiry the record still blocks")
			require.Equal(t, time.Nanosecond, ce.RetryAfter)
			require.Zero(t, c.n)

			clock.advance(2 * time.Nanosecond) // past the expiry (the guards differ on the instant itself)
			res, err := g.Do(t.Context(), req(`{}`), c.call(nil))
			require.NoError(t, err, "an expired pending record lets the call run again")
			require.Equal(t, "r1", string(res))
			require.Equal(t, 1, c.n)
			close(hold)
			require.NoError(t, <-first)
		})
	}
}

func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "not-a-dir")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	s := FileStore{Dir: file}
	_, err := s.Get("k")
	require.ErrorIs(t, err, ErrStoreUnavailable)
	require.ErrorIs(t, s.Put(Record{Key: "k"}), ErrStoreUnavailable)

	var c counter
	_, err = RecordAfter{Store: s}.Do(t.Context(), req(`{}`), c.call(nil))
	require.NoError(t, err, "record-after fails open")
	_, err = ExpiringInProgress{Store: s, TTL: time.Second}.Do(t.Context(), req(`{}`), c.call(nil))
	require.ErrorIs(t, err, ErrStoreUnavailable, "expiring-in-progress fails closed")
	require.Equal(t, 1, c.n)

	_, err = RecordAfter{Store: FileStore{Dir: t.TempDir()}}.Do(t.Context(), req(`{}`), c.call(errors.New("boom")))
	require.Error(t, err)
}

func TestMarkBeforeTreatsAnUnfinishedCallAsDone(t *testing.T) {
	t.Parallel()
	g := MarkBefore{Store: FileStore{Dir: t.TempDir()}}
	var c counter
	_, err := g.Do(t.Context(), req(`{}`), c.call(errors.New("crashed mid-call")))
	require.Error(t, err)
	res, err := g.Do(t.Context(), req(`{}`), c.call(nil))
	require.NoError(t, err, "the retry is dropped as a duplicate")
	require.Empty(t, res, "and reports success with no result")
	require.Equal(t, 1, c.n)
}
