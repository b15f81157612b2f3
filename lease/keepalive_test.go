package lease_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/residual"
)

// The keep-alive tests are not parallel: goleak.VerifyNone looks at every goroutine in the
// process, and parallel tests only start after all sequential ones have finished.

const (
	kaLength   = 3 * time.Second
	kaInterval = time.Second
	kaMargin   = 50 * time.Millisecond
	// failAfter bounds every real-time wait; it only matters when a test is failing.
	failAfter = 2 * time.Second
)

// renewer is a fake RenewFunc that records its calls and extends the lease by ext from the
// fake clock's now, or returns what errFor says for the n-th call (1-based).
type renewer struct {
	clock  *lease.Fake
	ext    time.Duration
	errFor func(n int) error

	mu    sync.Mutex
	calls []renewCall
}

type renewCall struct {
	at    time.Time   // fake time of the call
	got   lease.Lease // the lease it was asked to renew
	ctxOK bool        // the context was live during the call
}

func (r *renewer) renew(ctx context.Context, l lease.Lease) (lease.Lease, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	r.calls = append(r.calls, renewCall{at: now, got: l, ctxOK: ctx.Err() == nil})
	if r.errFor != nil {
		if err := r.errFor(len(r.calls)); err != nil {
			return lease.Lease{}, err
		}
	}
	l.Expires = now.Add(r.ext)
	return l, nil
}

func (r *renewer) n() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func (r *renewer) call(i int) renewCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[i]
}

type kaSetup struct {
	clock *lease.Fake
	lease lease.Lease
	r     *renewer
	cfg   lease.KeepAliveOptions
}

func setupKA(t *testing.T) *kaSetup {
	t.Helper()
	f := lease.NewFake(t0)
	return &kaSetup{
		clock: f,
		lease: lease.Lease{Resource: "invoice:INV-42", Holder: "agent-a", Token: 9, Expires: t0.Add(kaLength)},
		r:     &renewer{clock: f, ext: kaLength},
		cfg:   lease.KeepAliveOptions{Clock: f, Margin: kaMargin, Interval: kaInterval},
	}
}

// blockUntil is Fake.BlockUntil with a real-time bound, so a broken session fails the test
// instead of hanging it.
func blockUntil(t *testing.T, f *lease.Fake, n int) {
	t.Helper()
	ok := make(chan struct{})
	go func() { f.BlockUntil(n); close(ok) }()
	select {
	case <-ok:
	case <-time.After(failAfter):
		t.Fatalf("no goroutine waiting on the clock after %v (session goroutine gone?)", failAfter)
	}
}

func waitDone(t *testing.T, s *lease.Session) {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(failAfter):
		t.Fatalf("session did not end within %v", failAfter)
	}
}

func requireLive(t *testing.T, s *lease.Session) {
	t.Helper()
	select {
	case <-s.Done():
		t.Fatalf("session ended early: %v", s.Err())
	default:
	}
	require.NoError(t, s.Err())
	require.NoError(t, s.Ctx().Err())
}

// waiterOrDone waits until the session goroutine waits on the clock again (true) or the
// session has ended (false). Unlike BlockUntil it cannot hang on a session that ended.
func waiterOrDone(t *testing.T, f *lease.Fake, s *lease.Session) bool {
	t.Helper()
	deadline := time.Now().Add(failAfter)
	for {
		select {
		case <-s.Done():
			return false
		default:
		}
		if f.Waiters() > 0 {
			return true
		}
		if time.Now().After(deadline) {
			t.Fatalf("session neither waits on the clock nor ended within %v", failAfter)
		}
		runtime.Gosched()
	}
}

// driveUntilDone advances the clock by step, letting the session settle after each step,
// until the session ends or the clock passes limit. It returns whether the session ended.
func driveUntilDone(t *testing.T, f *lease.Fake, s *lease.Session, step time.Duration, limit time.Time) bool {
	t.Helper()
	for {
		if !waiterOrDone(t, f, s) {
			return true
		}
		if f.Now().After(limit) {
			return false
		}
		f.Advance(step)
	}
}

func TestKeepAliveRenewsEveryInterval(t *testing.T) {
	defer goleak.VerifyNone(t)
	ks := setupKA(t)
	s := lease.KeepAlive(context.Background(), ks.lease, ks.r.renew, ks.cfg)
	defer s.Close()

	prev := ks.lease
	for i := 1; i <= 10; i++ {
		blockUntil(t, ks.clock, 1)
		// Not a nanosecond early.
		ks.clock.Advance(kaInterval - time.Nanosecond)
		blockUntil(t, ks.clock, 1)
		require.Equal(t, i-1, ks.r.n(), "renewed before the interval was up")
		requireLive(t, s)

		ks.clock.Advance(time.Nanosecond)
		blockUntil(t, ks.clock, 1) // the goroutine renewed and waits again
		require.Equal(t, i, ks.r.n(), "renewal %d", i)
		c := ks.r.call(i - 1)
		require.Equal(t, t0.Add(time.Duration(i)*kaInterval), c.at, "renewal %d at the wrong time", i)
		require.Equal(t, prev, c.got, "renewal %d must be asked to renew the latest lease", i)
		require.True(t, c.ctxOK, "renewal runs under the live session context")

		got := s.Lease()
		require.Equal(t, ks.clock.Now().Add(kaLength), got.Expires, "Lease() returns the renewed lease")
		require.Equal(t, ks.lease.Token, got.Token)
		require.Equal(t, ks.lease.Resource, got.Resource)
		prev = got
		requireLive(t, s)
	}
	// Ten seconds in, far past the original expiry, the session is still live.
	require.True(t, ks.clock.Now().After(ks.lease.Expires))
	requireLive(t, s)

	s.Close()
	require.ErrorIs(t, s.Err(), lease.ErrClosed)
}

func TestKeepAliveDefaultIntervalIsAThirdOfTheLease(t *testing.T) {
	defer goleak.VerifyNone(t)
	ks := setupKA(t)
	ks.cfg.Interval = 0
	s := lease.KeepAlive(context.Background(), ks.lease, ks.r.renew, ks.cfg)
	defer s.Close()

	blockUntil(t, ks.clock, 1)
	ks.clock.Advance(kaLength/3 - time.Nanosecond)
	blockUntil(t, ks.clock, 1)
	require.Equal(t, 0, ks.r.n())
	ks.clock.Advance(time.Nanosecond)
	blockUntil(t, ks.clock, 1)
	require.Equal(t, 1, ks.r.n())
	requireLive(t, s)
}

func TestKeepAliveLeaseLostCancels(t *testing.T) {
	defer goleak.VerifyNone(t)
	ks := setupKA(t)
	lost := fmt.Errorf("ledger: token 9 superseded by 10: %w", residual.ErrLeaseLost)
	ks.r.errFor = func(n int) error {
		if n == 2 {
			return lost
		}
		return nil
	}
	s := lease.KeepAlive(context.Background(), ks.lease, ks.r.renew, ks.cfg)
	defer s.Close()

	blockUntil(t, ks.clock, 1)
	ks.clock.Advance(kaInterval) // renewal 1 succeeds
	blockUntil(t, ks.clock, 1)
	requireLive(t, s)
	renewed := s.Lease()

	ks.clock.Advance(kaInterval) // renewal 2: lease lost
	waitDone(t, s)
	require.Equal(t, 2, ks.r.n())
	require.ErrorIs(t, s.Err(), residual.ErrLeaseLost)
	require.ErrorIs(t, context.Cause(s.Ctx()), residual.ErrLeaseLost)
	require.ErrorIs(t, s.Ctx().Err(), context.Canceled)
	require.NotErrorIs(t, s.Err(), residual.ErrMarginTooSmall)
	require.True(t, ks.clock.Now().Before(renewed.Expires), "ended while the lease still had time: the refusal ended it")
	require.Equal(t, renewed, s.Lease(), "Lease() keeps the last successfully renewed lease")

	// Close after the end keeps the cause and does not renew again.
	s.Close()
	require.ErrorIs(t, s.Err(), residual.ErrLeaseLost)
	ks.clock.Advance(time.Hour)
	require.Equal(t, 2, ks.r.n())
}

func TestKeepAliveTransientErrorsEndBeforeExpiry(t *testing.T) {
	defer goleak.VerifyNone(t)
	ks := setupKA(t)
	ks.r.errFor = func(int) error { return errors.New("dial tcp: connection reset by peer") }
	s := lease.KeepAlive(context.Background(), ks.lease, ks.r.renew, ks.cfg)
	defer s.Close()

	const step = 10 * time.Millisecond
	ended := driveUntilDone(t, ks.clock, s, step, ks.lease.Expires.Add(time.Second))
	require.True(t, ended, "session outlived its lease with every renewal failing")

	now := ks.clock.Now()
	require.True(t, now.Before(ks.lease.Expires), "ctx must end before the lease expires (ended at +%v, expiry +%v)", now.Sub(t0), kaLength)
	require.False(t, now.After(ks.lease.Expires.Add(-kaMargin)), "ended with less than the margin left: +%v", now.Sub(t0))
	require.True(t, now.After(ks.lease.Expires.Add(-kaMargin-step)), "ended too early: +%v", now.Sub(t0))

	require.ErrorIs(t, s.Err(), residual.ErrMarginTooSmall)
	require.NotErrorIs(t, s.Err(), residual.ErrLeaseLost)
	// Transient errors were retried: at +1s and at +2s.
	require.GreaterOrEqual(t, ks.r.n(), 2, "transient renewal errors must be retried")
	for i := 0; i < ks.r.n(); i++ {
		require.Equal(t, ks.lease, ks.r.call(i).got, "failed renewals leave the lease unchanged")
	}
}

func TestKeepAliveRenewalDisabledEndsAtMargin(t *testing.T) {
	defer goleak.VerifyNone(t)
	ks := setupKA(t)
	ks.cfg.Interval = -1
	ks.cfg.Margin = 0 // defaults to DefaultMargin
	s := lease.KeepAlive(context.Background(), ks.lease, ks.r.renew, ks.cfg)
	defer s.Close()

	const step = 5 * time.Millisecond
	require.True(t, driveUntilDone(t, ks.clock, s, step, ks.lease.Expires.Add(time.Second)))
	now := ks.clock.Now()
	require.False(t, now.After(ks.lease.Expires.Add(-lease.DefaultMargin)), "ended at +%v", now.Sub(t0))
	require.True(t, now.After(ks.lease.Expires.Add(-lease.DefaultMargin-step)), "ended too early: +%v", now.Sub(t0))
	require.ErrorIs(t, s.Err(), residual.ErrMarginTooSmall)
	require.Equal(t, 0, ks.r.n(), "a negative interval disables renewal")
}

func TestKeepAliveLeaseAlreadyWithinMargin(t *testing.T) {
	defer goleak.VerifyNone(t)
	ks := setupKA(t)
	ks.lease.Expires = t0.Add(kaMargin) // exactly the margin left
	s := lease.KeepAlive(context.Background(), ks.lease, ks.r.renew, ks.cfg)
	defer s.Close()
	waitDone(t, s)
	require.ErrorIs(t, s.Err(), residual.ErrMarginTooSmall)
	require.Equal(t, 0, ks.r.n())
	require.Equal(t, t0, ks.clock.Now())
}

// TestKeepAliveDoesNotRenewAfterMissedDeadline: the session goroutine may wake late (GC
// pause, suspended VM; here: one big clock jump) after the lease has expired. By then the
// lease got within the margin without a successful renewal, so the session must end; it must
// not revive the lease with a late renewal the ledger might still accept.
func TestKeepAliveDoesNotRenewAfterMissedDeadline(t *testing.T) {
	defer goleak.VerifyNone(t)
	ks := setupKA(t)
	s := lease.KeepAlive(context.Background(), ks.lease, ks.r.renew, ks.cfg)
	defer s.Close()

	blockUntil(t, ks.clock, 1)
	ks.clock.Advance(10 * time.Second) // the original lease expired 7 s ago
	ended := driveUntilDone(t, ks.clock, s, time.Millisecond, ks.clock.Now())
	require.True(t, ended, "session survived its lease expiring without a renewal (renewals: %d)", ks.r.n())
	require.ErrorIs(t, s.Err(), residual.ErrMarginTooSmall)
	for i := 0; i < ks.r.n(); i++ {
		c := ks.r.call(i)
		require.True(t, c.got.Remaining(c.at) > kaMargin, "renew called with %v left on the lease", c.got.Remaining(c.at))
	}
}

func TestKeepAliveCloseStopsAndIsIdempotent(t *testing.T) {
	defer goleak.VerifyNone(t)
	ks := setupKA(t)
	s := lease.KeepAlive(context.Background(), ks.lease, ks.r.renew, ks.cfg)
	blockUntil(t, ks.clock, 1)
	requireLive(t, s)

	s.Close()
	select {
	case <-s.Done():
	default:
		t.Fatal("Close returned with the context still live")
	}
	require.ErrorIs(t, s.Err(), lease.ErrClosed)
	require.ErrorIs(t, s.Ctx().Err(), context.Canceled)
	s.Close()
	s.Close()
	require.ErrorIs(t, s.Err(), lease.ErrClosed)

	// No renewals after Close, however far time moves.
	ks.clock.Advance(time.Hour)
	require.Equal(t, 0, ks.r.n())
	require.Equal(t, ks.lease, s.Lease(), "Close does not touch the lease")
}

func TestKeepAliveConcurrentClose(t *testing.T) {
	defer goleak.VerifyNone(t)
	ks := setupKA(t)
	s := lease.KeepAlive(context.Background(), ks.lease, ks.r.renew, ks.cfg)
	blockUntil(t, ks.clock, 1)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); s.Close() }()
	}
	wg.Wait()
	require.ErrorIs(t, s.Err(), lease.ErrClosed)
}

// TestKeepAliveCloseDuringBlockedRenewal: a renewal stuck on the network honours its
// context. Close must end that context so the renewal returns, rather than wait for the
// goroutine while the goroutine waits for the context.
func TestKeepAliveCloseDuringBlockedRenewal(t *testing.T) {
	defer goleak.VerifyNone(t)
	ks := setupKA(t)
	entered := make(chan struct{})
	var once sync.Once
	blocking := func(ctx context.Context, l lease.Lease) (lease.Lease, error) {
		once.Do(func() { close(entered) })
		<-ctx.Done()
		return lease.Lease{}, ctx.Err()
	}
	parent, cancelParent := context.WithCancel(context.Background())
	defer cancelParent()
	s := lease.KeepAlive(parent, ks.lease, blocking, ks.cfg)

	blockUntil(t, ks.clock, 1)
	ks.clock.Advance(kaInterval)
	select {
	case <-entered:
	case <-time.After(failAfter):
		t.Fatal("renewal not attempted")
	}

	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
		require.ErrorIs(t, s.Err(), lease.ErrClosed)
	case <-time.After(10 * time.Second): // a deadlock never closes; a slow machine does
		t.Error("Close deadlocked: it waits for the goroutine before cancelling the context the renewal is blocked on")
		cancelParent() // unblock so the goroutines exit and the leak check can pass
		<-closed
	}
}

func TestKeepAliveParentCancelEndsSession(t *testing.T) {
	defer goleak.VerifyNone(t)
	ks := setupKA(t)
	parent, cancel := context.WithCancelCause(context.Background())
	s := lease.KeepAlive(parent, ks.lease, ks.r.renew, ks.cfg)
	defer s.Close()
	blockUntil(t, ks.clock, 1)
	requireLive(t, s)

	stop := errors.New("agent shutting down")
	cancel(stop)
	waitDone(t, s)
	require.ErrorIs(t, s.Ctx().Err(), context.Canceled)
	require.ErrorIs(t, s.Err(), stop, "the cause says why the session ended")
	require.NotErrorIs(t, s.Err(), residual.ErrLeaseLost)

	s.Close()
	require.ErrorIs(t, s.Err(), stop, "Close keeps the first cause")
	ks.clock.Advance(time.Hour)
	require.Equal(t, 0, ks.r.n(), "no renewals after the parent ended")
}

func TestKeepAliveParentDeadlineIsInherited(t *testing.T) {
	defer goleak.VerifyNone(t)
	ks := setupKA(t)
	dl := time.Now().Add(time.Hour)
	parent, cancel := context.WithDeadline(context.Background(), dl)
	defer cancel()
	s := lease.KeepAlive(parent, ks.lease, ks.r.renew, ks.cfg)
	defer s.Close()
	got, ok := s.Ctx().Deadline()
	require.True(t, ok)
	require.Equal(t, dl, got)
}

func TestKeepAliveRealClockDefault(t *testing.T) {
	defer goleak.VerifyNone(t)
	// The zero config uses the real clock and the default margin: a lease with 10 ms more
	// than the margin left ends about 10 ms later. No renewals (negative interval).
	l := lease.Lease{Resource: "r", Holder: "h", Token: 1, Expires: time.Now().Add(lease.DefaultMargin + 10*time.Millisecond)}
	s := lease.KeepAlive(context.Background(), l, func(context.Context, lease.Lease) (lease.Lease, error) {
		return lease.Lease{}, errors.New("not called")
	}, lease.KeepAliveOptions{Interval: -1})
	defer s.Close()
	waitDone(t, s)
	require.ErrorIs(t, s.Err(), residual.ErrMarginTooSmall)
}
