package main

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/residual"
)

// served is one running `toolfence serve --http --metrics`.
type served struct {
	cmd     *exec.Cmd
	mcp     string
	metrics string
}

// startServeMetrics runs `toolfence serve --http 127.0.0.1:0 --metrics 127.0.0.1:0` on store
// and returns the endpoints it reports; it is killed when the test ends.
func startServeMetrics(t *testing.T, store, tokens string) *served {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--http", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--token-file", tokens, "--store", store)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	mcpRe := regexp.MustCompile(`serving MCP at (http://\S+) `)
	metricsRe := regexp.MustCompile(`serving metrics at (http://\S+/metrics)`)
	urls := make(chan [2]string, 2)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := mcpRe.FindStringSubmatch(sc.Text()); m != nil {
				urls <- [2]string{"mcp", m[1]}
			}
			if m := metricsRe.FindStringSubmatch(sc.Text()); m != nil {
				urls <- [2]string{"metrics", m[1]}
			}
		}
	}()
	s := &served{cmd: cmd}
	for s.mcp == "" || s.metrics == "" {
		select {
		case u := <-urls:
			if u[0] == "mcp" {
				s.mcp = u[1]
			} else {
				s.metrics = u[1]
			}
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not report its MCP and metrics addresses")
		}
	}
	return s
}

// scrape reads /metrics and parses it with the Prometheus text-format parser.
func (s *served) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.metrics, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return families
}

// values returns the samples of family name by their labels ("k=v,k=v", sorted), leaving out
// the labels in ignore.
func values(families map[string]*dto.MetricFamily, name string, ignore ...string) map[string]float64 {
	out := map[string]float64{}
	f, ok := families[name]
	if !ok {
		return out
	}
	for _, m := range f.GetMetric() {
		var ls []string
		for _, l := range m.GetLabel() {
			if !contains(ignore, l.GetName()) {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
		}
		sort.Strings(ls)
		v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
		out[strings.Join(ls, ",")] += v
	}
	return out
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// The /metrics of a running serve, parsed with the Prometheus text parser, counts the calls
// made through it; after the server is killed with a call in flight (a crash), the
// open-residual gauges of a new server over the same store match what `toolfence ls` shows.
func TestServeMetricsCountCallsAndOpenResiduals(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// An expired lease in another namespace: its holder died long ago (effective unknown).
	f.with(past(2*time.Hour), func(l ledger.Ledger) {
		f.reserve(l, "other", "run-9", "charge", "invoice:9", time.Minute)
	})
	store := f.dir
	tokens := filepath.Join(t.TempDir(), "tokens")
	const token = "metrics-test-token-0123456789abcdef"
	require.NoError(t, os.WriteFile(tokens, []byte(token+" default\n"), 0o600))

	srv := startServeMetrics(t, store, tokens)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c, err := mcpserver.Dial(ctx, srv.mcp, token)
	require.NoError(t, err)
	defer c.Close()
	begin := func(target string, leaseMS int64) mcpserver.BeginResult {
		t.Helper()
		in := map[string]any{"task": "run-1", "operation": "charge", "target": target, "args": map[string]any{"cents": 100}}
		if leaseMS > 0 {
			in["lease_ms"] = leaseMS
		}
		var b mcpserver.BeginResult
		require.NoError(t, c.Call(ctx, mcpserver.ToolBegin, in, &b))
		return b
	}
	commit := func(b mcpserver.BeginResult, outcome string, status int, handle string) {
		t.Helper()
		require.Equal(t, mcpserver.DecisionProceed, b.Decision)
		require.NoError(t, c.Call(ctx, mcpserver.ToolCommit, map[string]any{
			"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret,
			"outcome": outcome, "upstream_status": status, "handle": handle, "result": map[string]any{"ok": true},
		}, nil))
	}
	commit(begin("invoice:A", 0), "succeeded", 201, "")
	require.Equal(t, mcpserver.DecisionReplay, begin("invoice:A", 0).Decision)
	commit(begin("invoice:B", 0), "accepted", 202, "https://pay.example/jobs/7")
	commit(begin("invoice:C", 0), "unknown", 504, "")
	inFlight := begin("invoice:D", time.Hour.Milliseconds()) // the holder is killed before it commits
	require.Equal(t, mcpserver.DecisionProceed, inFlight.Decision)
	for _, target := range []string{"invoice:B", "invoice:C", "invoice:D"} {
		require.Equal(t, mcpserver.DecisionBlocked, begin(target, 0).Decision, target)
	}

	m := srv.scrape(t)
	require.Equal(t, map[string]float64{
		"operation=charge,reason=succeeded,result=executed":        1,
		"operation=charge,reason=accepted,result=executed":         1,
		"operation=charge,reason=unknown,result=executed":          1,
		"operation=charge,reason=,result=replayed":                 1,
		"operation=charge,reason=awaiting_upstream,result=refused": 1,
		"operation=charge,reason=unknown_outcome,result=refused":   1,
		"operation=charge,reason=in_progress,result=refused":       1,
	}, withoutEmpty(values(m, "toolfence_calls_total")), "toolfence_calls_total counts the calls made")
	require.EqualValues(t, 8, histogramCount(m, "toolfence_ledger_step_duration_seconds", "step", "reserve"), "one reserve per begin_call")
	require.EqualValues(t, 3, histogramCount(m, "toolfence_ledger_step_duration_seconds", "step", "commit"), "one commit per commit_call")
	require.Equal(t, map[string]float64{"state=pending": 1, "state=unknown": 2, "state=accepted": 1},
		values(m, "toolfence_residuals_open"), "open residuals of every namespace, by effective state")
	require.Equal(t, map[string]float64{"": 1}, values(m, "toolfence_ledger_up"))

	// Crash: the server (and the holder of invoice:D) dies with the call in flight.
	require.NoError(t, srv.cmd.Process.Kill())
	_ = srv.cmd.Wait()

	// What ls shows of the store's open residuals, in every namespace, by state.
	shown := map[string]float64{}
	for _, ns := range []string{"default", "other"} {
		for _, r := range jsonLines(t, ok(t, "ls", "--store", store, "--namespace", ns, "--state", "pending,unknown,accepted", "--json").stdout) {
			require.True(t, r.State.Open(), "ls lists open residuals: %s is %s", r.Key, r.State)
			shown["state="+r.State.String()]++
		}
	}
	require.Equal(t, map[string]float64{"state=pending": 1, "state=unknown": 2, "state=accepted": 1}, shown)

	// A new server over the same store: its gauges match ls; its counters start from nothing.
	again := startServeMetrics(t, store, tokens)
	m = again.scrape(t)
	require.Equal(t, shown, values(m, "toolfence_residuals_open"), "the gauges match toolfence ls")
	ages := values(m, "toolfence_residuals_oldest_age_seconds")
	for _, s := range []residual.State{residual.Pending, residual.Unknown, residual.Accepted} {
		require.Greater(t, ages["state="+s.String()], 0.0, "the oldest %s residual has an age", s)
	}
	require.Greater(t, ages["state=unknown"], time.Hour.Seconds(), "the oldest unknown is the one from two hours ago")
	require.Empty(t, withoutEmpty(values(m, "toolfence_calls_total")), "a new process has counted no calls")
}

// withoutEmpty drops zero samples.
func withoutEmpty(v map[string]float64) map[string]float64 {
	for k, x := range v {
		if x == 0 {
			delete(v, k)
		}
	}
	return v
}

// histogramCount is the sample count of histogram name over the series with label = value.
func histogramCount(families map[string]*dto.MetricFamily, name, label, value string) uint64 {
	var n uint64
	for _, m := range families[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}
