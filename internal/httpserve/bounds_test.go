package httpserve_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/httpserve"
)

// TestCheckShape: JSON within both bounds passes (brackets, commas and quotes inside
// strings, escaped ones included, count nothing); one level or one value past a bound is
// refused with an error naming it; malformed JSON within the bounds is left to the decoder.
func TestCheckShape(t *testing.T) {
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	require.NoError(t, httpserve.CheckShape([]byte(nest(3)), 3, 100))
	err := httpserve.CheckShape([]byte(nest(4)), 3, 100)
	require.EqualError(t, err, "the request's JSON nests more than 3 levels deep")
	require.NoError(t, httpserve.CheckShape([]byte(`{"a":[[1],[2]]}`), 3, 100), "siblings do not add depth")

	// [1,2,3] counts the array and two commas: 3 values.
	require.NoError(t, httpserve.CheckShape([]byte(`[1,2,3]`), 10, 3))
	err = httpserve.CheckShape([]byte(`[1,2,3,4]`), 10, 3)
	require.EqualError(t, err, "the request's JSON holds more than 3 values (objects, arrays and elements)")
	require.ErrorContains(t, httpserve.CheckShape([]byte(`[`+strings.Repeat("{},", 10)+`{}]`), 10, 10), "more than 10 values")

	// Inside strings nothing counts, an escaped quote does not end the string.
	inString := `{"s":"[[[[{{{{,,,,\"[[[[,,,,\\\\"}`
	require.NoError(t, httpserve.CheckShape([]byte(inString), 1, 1))
	require.ErrorContains(t, httpserve.CheckShape([]byte(`{"s":"\\"}[[`), 1, 100), "levels deep",
		"an escaped backslash ends the escape, so the quote after it closes the string")

	require.NoError(t, httpserve.CheckShape([]byte(`{"a":]]]`), 1, 1), "malformed JSON is the decoder's to refuse")
	require.NoError(t, httpserve.CheckShape(nil, 0, 0))
}

// TestInFlight: slots are counted per owner and in all; a full owner or a full server is
// refused with a phrase naming the limit, another owner is served while only its owner is
// full, and released slots come back.
func TestInFlight(t *testing.T) {
	var f httpserve.InFlight
	require.Zero(t, f.Total())
	require.Empty(t, f.Acquire("a", 2, 3))
	require.Empty(t, f.Acquire("a", 2, 3))
	require.Equal(t, "this token has 2 requests in progress", f.Acquire("a", 2, 3))
	require.Equal(t, 2, f.Total(), "a refused Acquire takes nothing")
	require.Empty(t, f.Acquire("b", 2, 3), "another owner has its own slots")
	require.Equal(t, "3 requests are in progress on this server", f.Acquire("c", 2, 3))
	require.Equal(t, 3, f.Total())

	f.Release("a")
	require.Equal(t, 2, f.Total())
	require.Empty(t, f.Acquire("c", 2, 3), "a released slot comes back")
	f.Release("c")
	f.Release("b")
	f.Release("a")
	require.Zero(t, f.Total())
	require.Empty(t, f.Acquire("a", 1, 1), "every slot is back")
	f.Release("a")

	// Concurrent owners never pass the caps.
	const workers, rounds = 8, 200
	var wg sync.WaitGroup
	var mu sync.Mutex
	held := map[string]int{}
	over := 0
	for i := range workers {
		owner := string(rune('a' + i%2))
		wg.Go(func() {
			for range rounds {
				if f.Acquire(owner, 2, 3) != "" {
					continue
				}
				mu.Lock()
				held[owner]++
				total := 0
				for _, n := range held {
					total += n
				}
				if held[owner] > 2 || total > 3 {
					over++
				}
				held[owner]--
				mu.Unlock()
				f.Release(owner)
			}
		})
	}
	wg.Wait()
	require.Zero(t, over, "no owner held more than its cap, nobody more than the total")
	require.Zero(t, f.Total())
}
