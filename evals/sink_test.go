package evals

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func newTestSink(t *testing.T, honor bool) (*sink, *httptest.Server, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sink.log")
	s, err := newSink(sinkOptions{LogPath: path, HonorIdempotency: honor, CompleteAfter: 20 * time.Millisecond})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); _ = s.Close() })
	return s, srv, path
}

func postEffect(t *testing.T, base, query, intent, key string) (int, map[string]string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/effect?"+query,
		strings.NewReader(`{"intent":"`+intent+`","text":"x"}`))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := map[string]string{}
	_ = json.Unmarshal(b, &m)
	return resp.StatusCode, m, nil
}

func TestSinkFaultsApplyToTheFirstRequestOnly(t *testing.T) {
	t.Parallel()
	_, srv, path := newTestSink(t, false)
	status, _, err := postEffect(t, srv.URL, "mode=fail", "a", "k")
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, status, "the effect happened, the answer is 500")
	status, body, err := postEffect(t, srv.URL, "mode=fail", "a", "k")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "e-2", body["effect_id"])

	_, _, err = postEffect(t, srv.URL, "mode=drop", "b", "")
	require.Error(t, err, "a dropped answer is a transport error")

	recs, err := readLogFile(path)
	require.NoError(t, err)
	require.Len(t, recs, 3, "every request performed an effect, Idempotency-Key is not honoured by default")
	for i, r := range recs {
		require.Equal(t, int64(i+1), r.Seq)
		require.Equal(t, kindEffect, r.Kind)
	}
	require.Equal(t, recs[0].Digest, recs[1].Digest)
}

func TestSinkHonoursIdempotencyWhenSwitchedOn(t *testing.T) {
	t.Parallel()
	_, srv, path := newTestSink(t, true)
	for range 3 {
		status, body, err := postEffect(t, srv.URL, "", "a", "k1")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "e-1", body["effect_id"])
	}
	recs, err := readLogFile(path)
	require.NoError(t, err)
	require.Len(t, recs, 1)
}

func TestSinkQueuedJobsAndLookup(t *testing.T) {
	t.Parallel()
	_, srv, path := newTestSink(t, false)
	status, body, err := postEffect(t, srv.URL, "mode=queued", "a", "ka")
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, status)
	require.Equal(t, "j-1", body["job"])
	status, body, err = postEffect(t, srv.URL, "mode=queued_fail", "b", "kb")
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, status)
	require.Equal(t, "j-2", body["job"])

	lookup := func(key string) lookupAnswer {
		resp, err := http.Get(srv.URL + "/lookup?key=" + key)
		require.NoError(t, err)
		defer resp.Body.Close()
		var a lookupAnswer
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&a))
		return a
	}
	require.Eventually(t, func() bool {
		a, b := lookup("ka"), lookup("kb")
		return len(a.Effects) == 1 && len(b.Jobs) == 1 && b.Jobs[0].Status == "failed"
	}, 5*time.Second, 10*time.Millisecond)
	require.Empty(t, lookup("kb").Effects)

	resp, err := http.Get(srv.URL + "/status/j-1")
	require.NoError(t, err)
	var st map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	resp.Body.Close()
	require.Equal(t, "done", st["status"])

	recs, err := readLogFile(path)
	require.NoError(t, err)
	kinds := map[string]int{}
	for _, r := range recs {
		kinds[r.Kind]++
	}
	require.Equal(t, map[string]int{kindAccepted: 2, kindEffect: 1, kindJobFailed: 1}, kinds)
}

func TestSinkHoldsTheAnswerUntilReleased(t *testing.T) {
	t.Parallel()
	_, srv, path := newTestSink(t, false)
	type answer struct {
		status int
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		status, _, err := postEffect(t, srv.URL, "hold=1", "a", "")
		got <- answer{status, err}
	}()
	c := sinkClient{base: srv.URL, hc: http.DefaultClient}
	require.NoError(t, c.waitHeld(t.Context(), "a", 5*time.Second))
	recs, err := readLogFile(path)
	require.NoError(t, err)
	require.Len(t, recs, 1, "the effect is durable before the answer is released")
	select {
	case <-got:
		t.Fatal("the answer must be held")
	default:
	}
	require.NoError(t, c.release(context.Background(), "a", "respond"))
	a := <-got
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.status)

	go func() {
		_, _, err := postEffect(t, srv.URL, "hold=1", "b", "")
		got <- answer{0, err}
	}()
	require.NoError(t, c.waitHeld(t.Context(), "b", 5*time.Second))
	require.NoError(t, c.release(context.Background(), "b", "drop"))
	require.Error(t, (<-got).err, "a dropped held answer never reaches the client")
}

// TestSinkGroupCommitKeepsOneRecordPerEffect sends many requests at once: they share
// fsyncs, and the log still has exactly one record per effect, numbered without gaps.
func TestSinkGroupCommitKeepsOneRecordPerEffect(t *testing.T) {
	t.Parallel()
	s, srv, path := newTestSink(t, false)
	const n = 200
	ids := make(chan string, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			status, body, err := postEffect(t, srv.URL, "", "g-"+jsonInt(i), "")
			if err == nil && status != http.StatusOK {
				err = fmt.Errorf("status %d", status)
			}
			errs <- err
			ids <- body["effect_id"]
		}()
	}
	seen := map[string]bool{}
	for range n {
		require.NoError(t, <-errs)
		seen[<-ids] = true
	}
	require.Len(t, seen, n, "every request got its own effect")
	recs, err := readLogFile(path)
	require.NoError(t, err)
	require.Len(t, recs, n, "one record per effect")
	intents := map[string]bool{}
	for i, r := range recs {
		require.Equal(t, int64(i+1), r.Seq)
		require.True(t, seen[r.ID], "the log names the effect the client got")
		intents[r.Intent] = true
	}
	require.Len(t, intents, n)
	require.Positive(t, s.Syncs())
	require.LessOrEqual(t, s.Syncs(), int64(n), "never more fsyncs than records")
	t.Logf("%d records, %d fsyncs", n, s.Syncs())
}

// TestSinkHoldsAndReleasesABatch holds the first answers of a batch of intents, waits for
// all of them by prefix, and drops them all at once.
func TestSinkHoldsAndReleasesABatch(t *testing.T) {
	t.Parallel()
	_, srv, path := newTestSink(t, false)
	const n = 5
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, _, err := postEffect(t, srv.URL, "hold=1", "inv-x.b0."+jsonInt(i), "")
			errs <- err
		}()
	}
	go func() { _, _, _ = postEffect(t, srv.URL, "hold=1", "inv-y.b0.0", "") }() // another batch
	c := sinkClient{base: srv.URL, hc: http.DefaultClient}
	held, err := c.heldIntents(t.Context(), "inv-x.b0.", n, 5*time.Second)
	require.NoError(t, err)
	require.Len(t, held, n)
	_, err = c.heldIntents(t.Context(), "inv-x.b0.", n+1, 50*time.Millisecond)
	require.Error(t, err, "only n are held")
	require.NoError(t, c.releaseAll(t.Context(), "inv-x.b0.", "drop"))
	for range n {
		require.Error(t, <-errs, "every held answer of the batch was dropped")
	}
	held, err = c.heldIntents(t.Context(), "inv-y.b0.", 1, 5*time.Second)
	require.NoError(t, err)
	require.Len(t, held, 1, "the other batch is still held")
	require.NoError(t, c.releaseAll(t.Context(), "inv-y.b0.", "respond"))
	recs, err := readLogFile(path)
	require.NoError(t, err)
	require.Len(t, recs, n+1, "every effect was logged before its answer was held")
}

// TestWorkerPostNeverResendsOnItsOwn: a POST with an Idempotency-Key counts as replayable
// to net/http, which would resend it on a reused connection the sink dropped: a second
// effect no agent asked for. The worker's request must reach the sink once.
func TestWorkerPostNeverResendsOnItsOwn(t *testing.T) {
	t.Parallel()
	_, srv, path := newTestSink(t, false)
	warm := &worker{spec: workerSpec{Sink: srv.URL, Intent: "warm", Text: "x", TimeoutMS: 5000}}
	status, _, err := warm.post(t.Context(), "k0", "h", false)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	// The keep-alive connection is idle in the pool: the dropped request goes over it.
	w := &worker{spec: workerSpec{Sink: srv.URL, Intent: "a", Text: "x", Mode: modeDrop, TimeoutMS: 5000}}
	_, _, err = w.post(t.Context(), "k1", "h", true)
	require.Error(t, err, "the answer was dropped")
	recs, err := readLogFile(path)
	require.NoError(t, err)
	require.Len(t, recs, 2, "the warm-up and the dropped request, each once")
}

// Drain returns only once a queued job has recorded its outcome, and refuses new effects.
func TestSinkDrainWaitsForQueuedJobs(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sink.log")
	s, err := newSink(sinkOptions{LogPath: path, CompleteAfter: 300 * time.Millisecond})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); _ = s.Close() })
	status, body, err := postEffect(t, srv.URL, "mode=queued", "a", "k")
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, status)

	s.Drain()
	recs, err := readLogFile(path)
	require.NoError(t, err)
	require.Len(t, recs, 2, "the queued job's effect is in the log once Drain returns")
	require.Equal(t, kindAccepted, recs[0].Kind)
	require.Equal(t, kindEffect, recs[1].Kind)
	require.Equal(t, body["job"], recs[1].Job)

	status, _, err = postEffect(t, srv.URL, "", "b", "")
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, status, "a draining sink performs no new effect")
	recs, err = readLogFile(path)
	require.NoError(t, err)
	require.Len(t, recs, 2)
}

// The sink process drains before it exits, so Run can grade as soon as it has exited (no
// sleep): a job still queued when the parent closes the sink's stdin is in the log.
func TestSinkProcessDrainsBeforeExit(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sink.log")
	p, err := startProc(testCommand("sink", "--addr", "127.0.0.1:0", "--log", path, "--complete-after", "500ms", "--exit-on-stdin-eof"))
	require.NoError(t, err)
	defer p.kill()
	<-p.gotLine
	p.mu.Lock()
	base := p.first
	p.mu.Unlock()
	require.True(t, strings.HasPrefix(base, "http://"), base)
	status, _, err := postEffect(t, base, "mode=queued", "a", "k")
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, status)

	require.NoError(t, stopSink(p, time.Minute))
	recs, err := readLogFile(path)
	require.NoError(t, err)
	require.Len(t, recs, 2, "the job queued at shutdown recorded its effect before the sink exited")
	require.Equal(t, kindEffect, recs[1].Kind)
}

// TestSinkLookupByIntentFindsUnkeyedEffects: an effect requested without an
// Idempotency-Key (the payments MCP server of the proxy subjects sends none) is found by its
// intent, the way the proxy's probe asks; another intent finds nothing.
func TestSinkLookupByIntentFindsUnkeyedEffects(t *testing.T) {
	t.Parallel()
	_, srv, _ := newTestSink(t, false)
	status, body, err := postEffect(t, srv.URL, "", "order-1", "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	lookup := func(intent string) lookupAnswer {
		resp, err := http.Get(srv.URL + "/lookup?intent=" + intent)
		require.NoError(t, err)
		defer resp.Body.Close()
		var a lookupAnswer
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&a))
		return a
	}
	require.Equal(t, []lookupEffect{{ID: body["effect_id"]}}, lookup("order-1").Effects)
	require.Empty(t, lookup("order-2").Effects)
}
