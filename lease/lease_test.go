package lease_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/residual"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func testLease(expires time.Time) lease.Lease {
	return lease.Lease{Resource: "invoice:INV-42", Holder: "agent-a", Token: 7, Expires: expires}
}

func TestRemaining(t *testing.T) {
	t.Parallel()
	l := testLease(t0.Add(time.Second))
	require.Equal(t, time.Second, l.Remaining(t0))
	require.Equal(t, time.Nanosecond, l.Remaining(l.Expires.Add(-time.Nanosecond)))
	require.Equal(t, time.Duration(0), l.Remaining(l.Expires))
	require.Equal(t, -time.Second, l.Remaining(l.Expires.Add(time.Second)), "negative once expired")
}

func TestExpired(t *testing.T) {
	t.Parallel()
	l := testLease(t0.Add(time.Second))
	require.False(t, l.Expired(t0))
	require.False(t, l.Expired(l.Expires.Add(-time.Nanosecond)))
	require.True(t, l.Expired(l.Expires), "no time left exactly at expiry")
	require.True(t, l.Expired(l.Expires.Add(time.Nanosecond)))
	require.True(t, lease.Lease{}.Expired(t0), "the zero lease is expired")
}

func TestExpiredMonotonicAndWallAgree(t *testing.T) {
	t.Parallel()
	// A lease read back from storage has no monotonic reading; Now() has one. Comparisons
	// must still work.
	now := time.Now()
	stored := testLease(now.Add(time.Minute).Round(0).UTC())
	require.False(t, stored.Expired(now))
	require.InDelta(t, float64(time.Minute), float64(stored.Remaining(now)), float64(time.Millisecond))
}

func TestCheckMargin(t *testing.T) {
	t.Parallel()
	const margin = 50 * time.Millisecond
	l := testLease(t0.Add(time.Second))

	tests := []struct {
		name string
		left time.Duration
		ok   bool
	}{
		{"plenty", time.Second, true},
		{"margin plus 1ns", margin + time.Nanosecond, true},
		{"exactly margin", margin, false},
		{"margin minus 1ns", margin - time.Nanosecond, false},
		{"nothing", 0, false},
		{"expired", -time.Second, false},
	}
	for _, tt := range tests {
		err := l.CheckMargin(l.Expires.Add(-tt.left), margin)
		if tt.ok {
			require.NoError(t, err, tt.name)
			continue
		}
		require.ErrorIs(t, err, residual.ErrMarginTooSmall, tt.name)
		require.NotErrorIs(t, err, residual.ErrLeaseLost, tt.name)
		require.Contains(t, err.Error(), l.Resource, "%s: error names the resource", tt.name)
	}
}

func TestCheckMarginZeroMargin(t *testing.T) {
	t.Parallel()
	l := testLease(t0.Add(time.Second))
	require.NoError(t, l.CheckMargin(l.Expires.Add(-time.Nanosecond), 0))
	require.ErrorIs(t, l.CheckMargin(l.Expires, 0), residual.ErrMarginTooSmall, "an expired lease never passes")
}

func TestCheckMarginDefault(t *testing.T) {
	t.Parallel()
	require.Equal(t, 50*time.Millisecond, lease.DefaultMargin, "docs/design.md: default margin 50 ms")
	l := testLease(t0.Add(lease.DefaultMargin))
	require.ErrorIs(t, l.CheckMargin(t0, lease.DefaultMargin), residual.ErrMarginTooSmall)
	require.NoError(t, l.CheckMargin(t0.Add(-time.Millisecond), lease.DefaultMargin))
}

func TestLeaseJSON(t *testing.T) {
	t.Parallel()
	l := testLease(t0)
	b, err := json.Marshal(l)
	require.NoError(t, err)
	require.JSONEq(t, `{"resource":"invoice:INV-42","holder":"agent-a","token":7,"expires_at":"2025-03-01T12:00:00Z"}`, string(b))
	var back lease.Lease
	require.NoError(t, json.Unmarshal(b, &back))
	require.True(t, back.Expires.Equal(l.Expires))
	require.Equal(t, l.Token, back.Token)
}
