package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// twoRounds is `go test -bench` output of two rounds over two packages, as `make bench`
// writes it: the packages alternate, and BenchmarkReplay exists in both.
const twoRounds = `goos: linux
goarch: amd64
pkg: github.com/toolfence/toolfence/interceptor
cpu: AMD EPYC
BenchmarkFsyncFloor-2                	   20000	    100000 ns/op	       0 B/op	       0 allocs/op
BenchmarkGuardedCall-2               	    5000	    280000 ns/op	    4096 B/op	      50 allocs/op
BenchmarkGuardedCallParallel-2       	   30000	     70000 ns/op
BenchmarkGuardedCallParallelSyncWrites-2 	    5000	    350000 ns/op
BenchmarkReplay-2                    	 1000000	      1750 ns/op
PASS
pkg: github.com/toolfence/toolfence/ledger/postgres
BenchmarkPostgresGuardedCall-2       	    5000	    400000 ns/op
BenchmarkPostgresGuardedCallParallel/callers=8-2 	   10000	    150000 ns/op
BenchmarkPostgresGuardedCallParallel/callers=64-2 	   10000	    125000 ns/op
BenchmarkNaiveBaseline-2             	    5000	    420000 ns/op
BenchmarkReplay-2                    	  100000	     99999 ns/op
PASS
pkg: github.com/toolfence/toolfence/interceptor
BenchmarkFsyncFloor-2                	   20000	    100000 ns/op
BenchmarkGuardedCall-2               	    5000	    320000 ns/op
BenchmarkGuardedCallParallel-2       	   30000	     70000 ns/op
BenchmarkGuardedCallParallelSyncWrites-2 	    5000	    100000 ns/op
BenchmarkReplay-2                    	 1000000	      1850 ns/op
pkg: github.com/toolfence/toolfence/ledger/postgres
BenchmarkPostgresGuardedCall-2       	    5000	    440000 ns/op
BenchmarkPostgresGuardedCallParallel/callers=64-2 	   10000	    160000 ns/op
BenchmarkNaiveBaseline-2             	    5000	    400000 ns/op
`

func TestParseKeepsPackagesAndRoundsApart(t *testing.T) {
	s, err := parse(strings.NewReader(twoRounds))
	require.NoError(t, err)
	require.Equal(t, []float64{1750, 1850}, s[bench{"interceptor", "Replay"}])
	require.Equal(t, []float64{99999}, s[bench{"ledger/postgres", "Replay"}])
	require.Equal(t, []float64{125000, 160000}, s[bench{"ledger/postgres", "PostgresGuardedCallParallel/callers=64"}])
	require.Equal(t, []float64{150000}, s[bench{"ledger/postgres", "PostgresGuardedCallParallel/callers=8"}])
}

func TestJudgePairsRoundsAndCountsThoseThatMeet(t *testing.T) {
	s, err := parse(strings.NewReader(twoRounds))
	require.NoError(t, err)
	byIssue := func(what string) target {
		for _, tg := range targets {
			if strings.HasPrefix(tg.what, what) {
				return tg
			}
		}
		t.Fatalf("no target %q", what)
		return target{}
	}

	r, err := judge(byIssue("guarded call ≤ 1.5"), s)
	require.NoError(t, err)
	require.Equal(t, []float64{1.4, 1.6}, r.values) // 280/(2×100), 320/(2×100)
	require.Equal(t, 1, r.met)
	require.InDelta(t, 1.5, r.median, 1e-9)

	r, err = judge(byIssue("sequential guarded call"), s)
	require.NoError(t, err)
	require.InDeltaSlice(t, []float64{400.0 / 420, 1.1}, r.values, 1e-9)
	require.Equal(t, 1, r.met)
	require.False(t, r.ok(r.median), "median %.3f must miss ≤ 1.0", r.median)

	r, err = judge(byIssue("throughput at 64 callers"), s)
	require.NoError(t, err)
	require.InDeltaSlice(t, []float64{3.2, 2.75}, r.values, 1e-9)
	require.Equal(t, 0, r.met, "4.5 × is the target since the open set")

	r, err = judge(byIssue("replay"), s)
	require.NoError(t, err)
	require.Equal(t, 2, r.met)
}

func TestReportSaysWhatIsMissingAndTheVerdicts(t *testing.T) {
	s, err := parse(strings.NewReader(twoRounds))
	require.NoError(t, err)
	delete(s, bench{"interceptor", "FsyncFloor"})
	var out bytes.Buffer
	err = report(&out, s)
	require.ErrorContains(t, err, "interceptor.FsyncFloor: not measured")
	require.Contains(t, out.String(), "NOT MEASURED: interceptor.FsyncFloor: not measured")
	require.Contains(t, out.String(), "rounds: 5.00 1.43\n  median 3.21, met in 1 of 2 rounds: met")    // ParallelSyncWrites / Parallel
	require.Contains(t, out.String(), "rounds: 3.20 2.75\n  median 2.98, met in 0 of 2 rounds: MISSED") // 64 callers, 4.5 × at least
	require.Contains(t, out.String(), "median 1.80µs, met in 2 of 2 rounds: met")
}

func TestParseRefusesAnUnreadableTime(t *testing.T) {
	_, err := parse(strings.NewReader("BenchmarkX-2 10 abc ns/op\n"))
	require.ErrorContains(t, err, `line 1: "abc" is not a time per operation`)
}

func TestJudgeFindsBenchmarksOfOutputWithoutPackageLines(t *testing.T) {
	s, err := parse(strings.NewReader("BenchmarkPostgresGuardedCall-2 10 380 ns/op\nBenchmarkNaiveBaseline-2 10 400 ns/op\n" +
		"BenchmarkReplay-2 10 5 ns/op\n"))
	require.NoError(t, err)
	for _, tg := range targets {
		if tg.num.name == "PostgresGuardedCall" && tg.den.name == "NaiveBaseline" {
			r, err := judge(tg, s)
			require.NoError(t, err)
			require.Equal(t, []float64{0.95}, r.values)
		}
	}
	s[bench{"ledger/badger", "Replay"}] = []float64{6}
	require.Nil(t, lookup(s, bench{"interceptor", "Replay"}), "two packages have a Replay: the name alone must not pick one")
}

func TestJudgeRefusesRoundsThatCannotBePaired(t *testing.T) {
	s, err := parse(strings.NewReader(twoRounds))
	require.NoError(t, err)
	s[bench{"ledger/postgres", "NaiveBaseline"}] = s[bench{"ledger/postgres", "NaiveBaseline"}][:1]
	var out bytes.Buffer
	err = report(&out, s)
	require.ErrorContains(t, err, "ledger/postgres.PostgresGuardedCall has 2 samples and ledger/postgres.NaiveBaseline 1: the rounds cannot be paired")
}

// TestJudgeDifferenceTarget: the proxy's target is what a proxied call adds to a direct one,
// in guarded calls of the same round: (ProxyProtected − Direct) / GuardedCall.
func TestJudgeDifferenceTarget(t *testing.T) {
	const out = `pkg: github.com/toolfence/toolfence/internal/checks/proxybench
BenchmarkDirect/rev=2026-07-28-2                	     500	   2000000 ns/op
BenchmarkDirect/rev=2025-11-25-2                	     500	   2000000 ns/op
BenchmarkProxyProtected/rev=2026-07-28-2        	     200	   5000000 ns/op
BenchmarkProxyProtected/rev=2025-11-25-2        	     200	   4000000 ns/op
BenchmarkProxyBypassed/rev=2026-07-28-2         	     400	   2100000 ns/op
BenchmarkProxyBypassed/rev=2025-11-25-2         	     400	   2100000 ns/op
BenchmarkRelayFloor/rev=2026-07-28-2            	     400	   2000000 ns/op
BenchmarkRelayFloor/rev=2025-11-25-2            	     400	   2200000 ns/op
BenchmarkGuardedCall-2                          	     400	   2500000 ns/op
BenchmarkGuardedUpstreamCall/rev=2026-07-28-2   	     400	   4000000 ns/op
BenchmarkGuardedUpstreamCall/rev=2025-11-25-2   	     400	   4000000 ns/op
BenchmarkFsyncBackToBack-2                      	    5000	    200000 ns/op
BenchmarkFsyncSpaced-2                          	     900	    400000 ns/op
pkg: github.com/toolfence/toolfence/internal/checks/proxybench
BenchmarkDirect/rev=2026-07-28-2                	     500	   2000000 ns/op
BenchmarkDirect/rev=2025-11-25-2                	     500	   2000000 ns/op
BenchmarkProxyProtected/rev=2026-07-28-2        	     200	   6000000 ns/op
BenchmarkProxyProtected/rev=2025-11-25-2        	     200	   4400000 ns/op
BenchmarkProxyBypassed/rev=2026-07-28-2         	     400	   2400000 ns/op
BenchmarkProxyBypassed/rev=2025-11-25-2         	     400	   2200000 ns/op
BenchmarkRelayFloor/rev=2026-07-28-2            	     400	   2300000 ns/op
BenchmarkRelayFloor/rev=2025-11-25-2            	     400	   2200000 ns/op
BenchmarkGuardedCall-2                          	     400	   2000000 ns/op
BenchmarkGuardedUpstreamCall/rev=2026-07-28-2   	     400	   5000000 ns/op
BenchmarkGuardedUpstreamCall/rev=2025-11-25-2   	     400	   4000000 ns/op
BenchmarkFsyncBackToBack-2                      	    5000	    200000 ns/op
BenchmarkFsyncSpaced-2                          	     900	    300000 ns/op
`
	s, err := parse(strings.NewReader(out))
	require.NoError(t, err)
	var got []result
	for _, tg := range targets {
		if tg.issue == 25 || tg.issue == 13 {
			r, err := judge(tg, s)
			require.NoError(t, err)
			got = append(got, r)
		}
	}
	require.Len(t, got, 7)
	require.InDeltaSlice(t, []float64{1.05, 2.4 / 2.3}, got[0].values, 1e-9) // bypassed ÷ relay floor, 2026-07-28
	require.Equal(t, 2, got[0].met)
	require.InDeltaSlice(t, []float64{1.25, 1.2}, got[1].values, 1e-9) // protected ÷ in-process: 5/4, 6/5
	require.Equal(t, 1, got[1].met)
	require.InDeltaSlice(t, []float64{2.1 / 2.2, 1.0}, got[2].values, 1e-9) // 2025-11-25
	require.InDeltaSlice(t, []float64{1.0, 1.1}, got[3].values, 1e-9)
	require.Equal(t, 2, got[3].met)
	require.InDeltaSlice(t, []float64{1.2, 2.0}, got[4].values, 1e-9)  // reference: (5−2)/2.5, (6−2)/2
	require.InDeltaSlice(t, []float64{2.0, 1.5}, got[5].values, 1e-9)  // spaced ÷ back-to-back syncs
	require.InDeltaSlice(t, []float64{1.0, 1.15}, got[6].values, 1e-9) // the relay floor ÷ direct

	delete(s, bench{"internal/checks/proxybench", "Direct/rev=2026-07-28"})
	var diff target
	for _, tg := range targets {
		if tg.num.name == "ProxyProtected/rev=2026-07-28" && tg.minus.name != "" {
			diff = tg
		}
	}
	_, err = judge(diff, s)
	require.ErrorContains(t, err, "Direct/rev=2026-07-28: not measured")
}

// The figures of b.ReportMetric are samples of their own: the write amplification of the
// PostgreSQL ledger is printed per round beside the throughput targets, in its unit.
func TestReportPrintsTheWriteFigures(t *testing.T) {
	const out = `pkg: github.com/toolfence/toolfence/ledger/postgres
BenchmarkPostgresGuardedCall-2 	 5000	 400000 ns/op	 100.0 HOT-%	 3.020 heap-rows/op	 5.020 index-entries/op	 6168 B/op	 70 allocs/op
BenchmarkPostgresGuardedCallParallel/callers=8-2 	 10000	 120000 ns/op	 100.0 HOT-%	 3.019 heap-rows/op	 5.019 index-entries/op
BenchmarkPostgresGuardedCallParallel/callers=64-2 	 10000	 80000 ns/op	 99.39 HOT-%	 3.012 heap-rows/op	 5.037 index-entries/op
BenchmarkPostgresGuardedCall-2 	 5000	 420000 ns/op	 100.0 HOT-%	 3.020 heap-rows/op	 5.020 index-entries/op
BenchmarkPostgresGuardedCallParallel/callers=8-2 	 10000	 140000 ns/op	 100.0 HOT-%	 3.019 heap-rows/op	 5.019 index-entries/op
BenchmarkPostgresGuardedCallParallel/callers=64-2 	 10000	 100000 ns/op	 98.00 HOT-%	 3.012 heap-rows/op	 12.01 index-entries/op
`
	s, err := parse(strings.NewReader(out))
	require.NoError(t, err)
	require.Equal(t, []float64{5.037, 12.01}, s[bench{"ledger/postgres", "PostgresGuardedCallParallel/callers=64 index-entries/op"}])
	require.Equal(t, []float64{400000, 420000}, s[bench{"ledger/postgres", "PostgresGuardedCall"}])
	var w bytes.Buffer
	_ = report(&w, s)                                                                                 // the other packages' targets are not measured here
	require.Contains(t, w.String(), "rounds: 3.33 3.00\n  median 3.17, met in 1 of 2 rounds: MISSED") // 8 callers
	require.Contains(t, w.String(), "rounds: 5.00 4.20\n  median 4.60, met in 1 of 2 rounds: met")    // 64 callers
	require.Contains(t, w.String(), "rounds: 5.04 index-entries/op 12.01 index-entries/op\n  median 8.52 index-entries/op")
	require.Contains(t, w.String(), "rounds: 99.39 HOT-% 98.00 HOT-%\n")
}
