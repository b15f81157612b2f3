package lease

import (
	"fmt"
	"time"

	"github.com/toolfence/toolfence/residual"
)

// DefaultMargin is the safety margin used when none is configured: the lease must have more
// than this left at dispatch and at commit.
const DefaultMargin = 50 * time.Millisecond

// Lease is an exclusive, time-bounded right of Holder to act on Resource. Token is the
// fencing token: it only grows per resource, across every holder, so a write that carries
// an older token can be refused.
type Lease struct {
	Resource string    `json:"resource"`
	Holder   string    `json:"holder"`
	Token    uint64    `json:"token"`
	Expires  time.Time `json:"expires_at"`
}

// Remaining returns the time left at now; it is negative once the lease has expired.
func (l Lease) Remaining(now time.Time) time.Duration { return l.Expires.Sub(now) }

// Expired reports whether the lease has no time left at now.
func (l Lease) Expired(now time.Time) bool { return !now.Before(l.Expires) }

// CheckMargin returns nil when more than margin is left on the lease at now, and an error
// wrapping residual.ErrMarginTooSmall that says how much was left otherwise.
func (l Lease) CheckMargin(now time.Time, margin time.Duration) error {
	if left := l.Remaining(now); left <= margin {
		return fmt.Errorf("%w: %v left on lease of %s (token %d), margin is %v",
			residual.ErrMarginTooSmall, left.Round(time.Millisecond), l.Resource, l.Token, margin)
	}
	return nil
}
