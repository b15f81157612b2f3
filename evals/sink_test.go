package evals

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func newTestSink(t *testing.T, honor bool) (*Sink, *httptest.Server, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sink.log")
	s, err := NewSink(SinkConfig{LogPath: path, HonorIdempotency: honor, CompleteAfter: 20 * time.Millisecond})
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

	recs, err := ReadLogFile(path)
	require.NoError(t, err)
	require.Len(t, recs, 3, "every request performed an effect, Idempotency-Key is not honoured by default")
	for i, r := range recs {
		require.Equal(t, int64(i+1), r.Seq)
		require.Equal(t, KindEffect, r.Kind)
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
	recs, err := ReadLogFile(path)
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

	lookup := func(key string) LookupAnswer {
		resp, err := http.Get(srv.URL + "/lookup?key=" + key)
		require.NoError(t, err)
		defer resp.Body.Close()
		var a LookupAnswer
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

	recs, err := ReadLogFile(path)
	require.NoError(t, err)
	kinds := map[string]int{}
	for _, r := range recs {
		kinds[r.Kind]++
	}
	require.Equal(t, map[string]int{KindAccepted: 2, KindEffect: 1, KindJobFailed: 1}, kinds)
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
	recs, err := ReadLogFile(path)
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
