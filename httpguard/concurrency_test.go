package httpguard_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/httpguard"
)

// 50 identical requests at once over a real listener: the handler runs once; the first
// gets 201 and the 49 others 409 (the first is still in flight); afterwards every retry is
// a replay of the one response.
func TestConcurrentIdenticalRequestsRunOnce(t *testing.T) {
	t.Parallel()
	const n = 50
	f := setup(t, func(o *setupOpts) {
		o.api.gate = make(chan struct{})
		o.api.entered = make(chan struct{}, 1)
	})
	tr := f.transports()["listener"].(listener)
	tr.client.Transport.(*http.Transport).MaxIdleConnsPerHost = n

	replies := make(chan reply, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { replies <- tr.send(t, post("/charges", keyA, `{"amount":99}`)) })
	}
	<-f.api.entered
	var conflicts int
	for range n - 1 { // everyone but the one in the handler is refused while it runs
		r := <-replies
		require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
		require.Equal(t, httpguard.ProblemInProgress, r.problem(t).Type)
		require.NotEmpty(t, r.header.Get("Retry-After"))
		conflicts++
	}
	close(f.api.gate)
	wg.Wait()
	first := <-replies
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, n-1, conflicts)
	require.EqualValues(t, 1, f.api.charges.Load(), "the handler ran once")

	// The retries that were told to come back now get the recorded answer.
	var rwg sync.WaitGroup
	for range n {
		rwg.Go(func() {
			r := tr.send(t, post("/charges", keyA, `{"amount":99}`))
			if r.status != http.StatusCreated || string(r.body) != string(first.body) || r.header.Get(httpguard.ReplayHeader) != "true" {
				t.Errorf("retry got %d %s (replayed=%q)", r.status, r.body, r.header.Get(httpguard.ReplayHeader))
			}
		})
	}
	rwg.Wait()
	require.EqualValues(t, 1, f.api.charges.Load())
}

// Seed 003's checkpoint: the same request twice within 50 ms; the second returns the
// exact cached body without reaching the handler (nor what it calls downstream). The second
// request leaves as soon as the first answered, and its replay, which writes nothing, must
// itself take less than 50 ms. The first request's time is two fsyncs of the ledger: about
// 4 ms on an idle machine, logged here rather than asserted, since a loaded CI disk can
// stretch a single fsync past 50 ms. Not parallel, so the package's other tests do not share
// its time window.
func TestSameRequestTwiceWithin50ms(t *testing.T) {
	f := setup(t)
	tr := f.transports()["listener"]
	start := time.Now()
	first := tr.send(t, post("/charges", keyA, `{"amount":1200}`))
	answered := time.Now()
	second := tr.send(t, post("/charges", keyA, `{"amount":1200}`))
	replay := time.Since(answered)
	t.Logf("first request %v (reserve and commit, each synced); second request %v after the first was sent; replay %v",
		answered.Sub(start), answered.Sub(start)+replay, replay)

	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, http.StatusCreated, second.status)
	require.Equal(t, first.body, second.body)
	require.Equal(t, "true", second.header.Get(httpguard.ReplayHeader))
	require.EqualValues(t, 1, f.api.charges.Load(), "the second never reached the handler")
	require.Less(t, replay, 50*time.Millisecond*time.Duration(raceSlowdown), "the replay answered within 50 ms")
}
