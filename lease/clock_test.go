package lease_test

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
)

var (
	_ lease.Clock = lease.Real{}
	_ lease.Clock = (*lease.Fake)(nil)
)

// fired reports whether ch has a value ready right now. Fake fires waiters synchronously
// inside Advance/Set, so no waiting is needed.
func fired(ch <-chan time.Time) (time.Time, bool) {
	select {
	case v := <-ch:
		return v, true
	default:
		return time.Time{}, false
	}
}

func TestFakeNowAdvanceSet(t *testing.T) {
	t.Parallel()
	f := lease.NewFake(t0)
	require.Equal(t, t0, f.Now())
	require.Equal(t, t0, f.Now(), "time does not move by itself")

	f.Advance(time.Second)
	require.Equal(t, t0.Add(time.Second), f.Now())

	f.Set(t0.Add(time.Minute))
	require.Equal(t, t0.Add(time.Minute), f.Now())

	f.Set(t0) // never backwards
	require.Equal(t, t0.Add(time.Minute), f.Now())

	f.Advance(-time.Hour) // never backwards
	require.Equal(t, t0.Add(time.Minute), f.Now())
}

func TestFakeAfterFiresAtDueTimeNotBefore(t *testing.T) {
	t.Parallel()
	f := lease.NewFake(t0)
	ch := f.After(time.Second)
	require.Equal(t, 1, f.Waiters())

	f.Advance(time.Second - time.Nanosecond)
	_, ok := fired(ch)
	require.False(t, ok, "fired 1ns early")
	require.Equal(t, 1, f.Waiters())

	f.Advance(time.Nanosecond)
	v, ok := fired(ch)
	require.True(t, ok, "did not fire exactly at the due time")
	require.Equal(t, t0.Add(time.Second), v, "the channel carries the fake time")
	require.Equal(t, 0, f.Waiters())

	// It fires once.
	f.Advance(time.Hour)
	_, ok = fired(ch)
	require.False(t, ok)
}

func TestFakeAfterFiresWhenAdvancedPastDue(t *testing.T) {
	t.Parallel()
	f := lease.NewFake(t0)
	ch := f.After(time.Second)
	f.Advance(time.Hour)
	v, ok := fired(ch)
	require.True(t, ok)
	require.Equal(t, t0.Add(time.Hour), v)
}

func TestFakeAfterWithSet(t *testing.T) {
	t.Parallel()
	f := lease.NewFake(t0)
	ch := f.After(time.Second)
	f.Set(t0.Add(500 * time.Millisecond))
	_, ok := fired(ch)
	require.False(t, ok)
	f.Set(t0.Add(time.Second))
	_, ok = fired(ch)
	require.True(t, ok)
}

func TestFakeAfterNonPositiveFiresAtOnce(t *testing.T) {
	t.Parallel()
	f := lease.NewFake(t0)
	for _, d := range []time.Duration{0, -time.Nanosecond, -time.Hour} {
		v, ok := fired(f.After(d))
		require.True(t, ok, "After(%v)", d)
		require.Equal(t, t0, v)
	}
	require.Equal(t, 0, f.Waiters())
}

func TestFakeAfterManyWaiters(t *testing.T) {
	t.Parallel()
	f := lease.NewFake(t0)
	a := f.After(1 * time.Second)
	b := f.After(3 * time.Second)
	c := f.After(2 * time.Second)
	require.Equal(t, 3, f.Waiters())

	f.Advance(2 * time.Second)
	_, okA := fired(a)
	_, okB := fired(b)
	_, okC := fired(c)
	require.True(t, okA)
	require.False(t, okB)
	require.True(t, okC)
	require.Equal(t, 1, f.Waiters())

	// A waiter registered later is due relative to the time it was registered.
	d := f.After(time.Second) // due at t0+3s, same as b
	f.Advance(time.Second)
	_, okB = fired(b)
	_, okD := fired(d)
	require.True(t, okB)
	require.True(t, okD)
	require.Equal(t, 0, f.Waiters())
}

func TestFakeAdvanceDoesNotBlockOnUnreadChannels(t *testing.T) {
	t.Parallel()
	f := lease.NewFake(t0)
	for i := 0; i < 100; i++ {
		f.After(time.Second) // nobody ever reads these
	}
	f.Advance(time.Second) // must not block
	require.Equal(t, 0, f.Waiters())
}

func TestFakeBlockUntil(t *testing.T) {
	t.Parallel()
	f := lease.NewFake(t0)
	f.BlockUntil(0) // nothing to wait for

	got := make(chan time.Time, 2)
	for i := 0; i < 2; i++ {
		go func() { got <- <-f.After(time.Second) }()
	}
	f.BlockUntil(2)
	require.GreaterOrEqual(t, f.Waiters(), 2)
	f.Advance(time.Second)
	require.Equal(t, t0.Add(time.Second), <-got)
	require.Equal(t, t0.Add(time.Second), <-got)
}

func TestFakeBlockUntilWaitsForEnough(t *testing.T) {
	t.Parallel()
	f := lease.NewFake(t0)
	returned := make(chan struct{})
	go func() {
		f.BlockUntil(2)
		close(returned)
	}()
	f.After(time.Second)
	select {
	case <-returned:
		t.Fatal("BlockUntil(2) returned with one waiter")
	default:
	}
	f.After(time.Second)
	<-returned // would hang (test timeout) if the second After did not wake BlockUntil
}

// TestFakeConcurrentUse runs every method from many goroutines; run with -race.
func TestFakeConcurrentUse(t *testing.T) {
	t.Parallel()
	f := lease.NewFake(t0)
	const n = 16
	var wg sync.WaitGroup
	results := make(chan time.Time, n)
	for i := 0; i < n; i++ {
		wg.Add(3)
		go func() {
			defer wg.Done()
			results <- <-f.After(time.Duration(i+1) * time.Millisecond)
		}()
		go func() {
			defer wg.Done()
			for j := 0; j < 50; j++ {
				_ = f.Now()
				_ = f.Waiters()
			}
		}()
		go func() {
			defer wg.Done()
			f.Advance(time.Microsecond)
		}()
	}
	// Every After goroutine eventually registers or has already fired; a large jump
	// fires all that remain. Keep jumping until all n have reported.
	for got := 0; got < n; {
		select {
		case v := <-results:
			require.False(t, v.Before(t0))
			got++
		default:
			f.Advance(time.Second)
			runtime.Gosched()
		}
	}
	wg.Wait()
	require.Equal(t, 0, f.Waiters())
}

// TestFakeConcurrentAdvanceLosesNoTime: Advance from several goroutines at once must move
// the clock by the sum of the advances. Advance reads Now and then calls Set outside one
// critical section, so two concurrent advances can collapse into one.
func TestFakeConcurrentAdvanceLosesNoTime(t *testing.T) {
	t.Parallel()
	f := lease.NewFake(t0)
	const goroutines, each = 8, 2000
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				f.Advance(time.Nanosecond)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, goroutines*each*time.Nanosecond, f.Now().Sub(t0), "concurrent Advance calls lost time")
}

func TestRealClock(t *testing.T) {
	t.Parallel()
	var c lease.Real
	before := time.Now()
	now := c.Now()
	require.False(t, now.Before(before))
	require.Less(t, now.Sub(before), time.Second)

	select {
	case <-c.After(0):
	case <-time.After(5 * time.Second):
		t.Fatal("Real.After(0) did not fire")
	}
	start := time.Now()
	select {
	case v := <-c.After(time.Millisecond):
		require.GreaterOrEqual(t, v.Sub(start), time.Millisecond)
	case <-time.After(5 * time.Second):
		t.Fatal("Real.After(1ms) did not fire")
	}
}
