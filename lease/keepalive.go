package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/toolfence/toolfence/residual"
)

// RenewFunc extends a lease under its token and returns the renewed lease. It returns an
// error wrapping residual.ErrLeaseLost when the lease can no longer be renewed (expired,
// preempted, stale token); other errors are treated as transient and retried.
type RenewFunc func(ctx context.Context, l Lease) (Lease, error)

// KeepAliveOptions configures KeepAlive. The zero value of each field has a default.
type KeepAliveOptions struct {
	// Clock drives the waits. Defaults to Real.
	Clock Clock
	// Margin: the session ends when less than this is left on the lease. Defaults to
	// DefaultMargin.
	Margin time.Duration
	// Interval between renewals. Zero defaults to a third of the lease's original length;
	// negative disables renewal, so the session only ends the call before the lease does.
	Interval time.Duration
}

// Session keeps one lease alive for the length of a call, like etcd's concurrency.Session.
// Its context ends before the lease does: when a renewal is refused, when the lease gets
// within the margin of its expiry without a successful renewal, when the parent context
// ends, or on Close. Close must be called; it stops the goroutine and waits for it.
type Session struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once

	mu    sync.Mutex
	lease Lease
}

// ErrClosed is the one "closed" of toolfence: the cause of a session's context after Close,
// and what the calls of a closed ledger (every backend) or a closed mcpserver.Server return
// or wrap.
var ErrClosed = errors.New("lease: closed")

// KeepAlive starts a session for l that renews it with renew every interval. The session's
// context derives from parent; its cause (context.Cause) says why it ended.
func KeepAlive(parent context.Context, l Lease, renew RenewFunc, cfg KeepAliveOptions) *Session {
	clock := cmp.Or[Clock](cfg.Clock, Real{})
	margin := cmp.Or(cfg.Margin, DefaultMargin)
	interval := cfg.Interval
	if interval == 0 {
		interval = l.Remaining(clock.Now()) / 3
	}
	ctx, cancel := context.WithCancelCause(parent)
	s := &Session{ctx: ctx, cancel: cancel, stop: make(chan struct{}), done: make(chan struct{}), lease: l}
	go s.run(clock, margin, interval, renew)
	return s
}

// Ctx returns the context the guarded call must run under.
func (s *Session) Ctx() context.Context { return s.ctx }

// Done closes when the session's context ends: the lease is lost, about to expire without
// renewal, the parent ended, or Close was called.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Err returns why the session ended (wrapping residual.ErrLeaseLost or ErrMarginTooSmall
// when the lease was the reason), or nil while it is live.
func (s *Session) Err() error {
	if s.ctx.Err() == nil {
		return nil
	}
	return context.Cause(s.ctx)
}

// Lease returns the lease as last renewed.
func (s *Session) Lease() Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease
}

// Close stops renewing, ends the context and waits for the session's goroutine to exit. It
// does not release the lease. It is safe to call more than once.
func (s *Session) Close() {
	s.once.Do(func() { close(s.stop) })
	// Cancel first: a renewal blocked on its context must not keep Close waiting.
	s.cancel(ErrClosed)
	<-s.done
}

func (s *Session) run(clock Clock, margin, interval time.Duration, renew RenewFunc) {
	defer close(s.done)
	lastRenew := clock.Now()
	for {
		now := clock.Now()
		cur := s.Lease()
		deadline := cur.Remaining(now) - margin
		if deadline <= 0 {
			s.cancel(fmt.Errorf("%w: lease of %s (token %d) is within %v of expiry",
				residual.ErrMarginTooSmall, cur.Resource, cur.Token, margin))
			return
		}
		wait := deadline
		if interval > 0 {
			wait = min(wait, max(lastRenew.Add(interval).Sub(now), 0))
		}
		select {
		case <-s.stop:
			return
		case <-s.ctx.Done():
			return
		case <-clock.After(wait):
		}
		// After a late wake-up (GC pause, suspended VM) the lease may already be inside the
		// margin: never renew it then; the check at the top of the loop ends the session.
		if now := clock.Now(); interval <= 0 || now.Before(lastRenew.Add(interval)) || cur.Remaining(now) <= margin {
			continue
		}
		nl, err := renew(s.ctx, cur)
		switch {
		case err == nil:
			s.mu.Lock()
			s.lease = nl
			s.mu.Unlock()
			lastRenew = clock.Now()
		case errors.Is(err, residual.ErrLeaseLost):
			s.cancel(err)
			return
		default:
			// Transient: try again at the next interval; the deadline check above ends the
			// call before the lease runs out if renewals keep failing.
			lastRenew = clock.Now()
		}
	}
}
