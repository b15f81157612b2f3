package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// baseRounds is three rounds of an older build of ledger/postgres; BenchmarkGone exists only
// there, and its result lines carry no b.ReportMetric figures.
const baseRounds = `pkg: github.com/toolfence/toolfence/ledger/postgres
BenchmarkPostgresGuardedCall-2       	    5000	    500000 ns/op
BenchmarkPostgresGuardedCallParallel/callers=8-2 	   10000	    200000 ns/op
BenchmarkGone-2 	   10000	    1000 ns/op
BenchmarkPostgresGuardedCall-2       	    5000	    600000 ns/op
BenchmarkPostgresGuardedCallParallel/callers=8-2 	   10000	    200000 ns/op
BenchmarkGone-2 	   10000	    1000 ns/op
BenchmarkPostgresGuardedCall-2       	    5000	    400000 ns/op
BenchmarkPostgresGuardedCallParallel/callers=8-2 	   10000	    250000 ns/op
BenchmarkGone-2 	   10000	    1000 ns/op
`

// headRounds is the same rounds of the build under test, whose benchmarks report write
// figures and which has a benchmark the base lacks.
const headRounds = `pkg: github.com/toolfence/toolfence/ledger/postgres
BenchmarkPostgresGuardedCall-2       	    5000	    550000 ns/op	9.000 index-entries/op
BenchmarkPostgresGuardedCallParallel/callers=8-2 	   10000	    300000 ns/op	9.000 index-entries/op
BenchmarkNew-2 	   10000	    1000 ns/op
BenchmarkPostgresGuardedCall-2       	    5000	    540000 ns/op	9.000 index-entries/op
BenchmarkPostgresGuardedCallParallel/callers=8-2 	   10000	    180000 ns/op	9.000 index-entries/op
BenchmarkNew-2 	   10000	    1000 ns/op
BenchmarkPostgresGuardedCall-2       	    5000	    360000 ns/op	9.000 index-entries/op
BenchmarkPostgresGuardedCallParallel/callers=8-2 	   10000	    250000 ns/op	9.000 index-entries/op
BenchmarkNew-2 	   10000	    1000 ns/op
`

func mustParse(t *testing.T, s string) map[bench][]float64 {
	t.Helper()
	m, err := parse(strings.NewReader(s))
	require.NoError(t, err)
	return m
}

// Each benchmark's rounds are paired by position: the ratio of a round is this build's time
// over the base's in that round, and the verdict follows the median of those ratios, not
// the ratio of the medians. Benchmarks of one build only and metric figures are not compared.
func TestComparePairsRoundsAndJudgesTheMedianRatio(t *testing.T) {
	cs, only, err := compare(mustParse(t, baseRounds), mustParse(t, headRounds))
	require.NoError(t, err)
	require.Len(t, cs, 2)
	require.Equal(t, "ledger/postgres.PostgresGuardedCall", cs[0].String())
	require.InDeltaSlice(t, []float64{1.1, 0.9, 0.9}, cs[0].ratios, 1e-9)
	require.InDelta(t, 0.9, cs[0].median, 1e-9)
	require.Equal(t, "ledger/postgres.PostgresGuardedCallParallel/callers=8", cs[1].String())
	require.InDeltaSlice(t, []float64{1.5, 0.9, 1.0}, cs[1].ratios, 1e-9)
	require.InDelta(t, 1.0, cs[1].median, 1e-9)
	require.Equal(t, []string{"ledger/postgres.Gone (base only)", "ledger/postgres.New (this build only)"}, only)

	var out bytes.Buffer
	reportComparison(&out, cs, only)
	require.Contains(t, out.String(), "ledger/postgres.PostgresGuardedCall\n  base µs/op: 500.0 600.0 400.0\n  this µs/op: 550.0 540.0 360.0\n  this ÷ base per round: 1.10 0.90 0.90\n  median 0.90: no slower than the base\n")
	require.Contains(t, out.String(), "median 1.00: no slower than the base")
	require.Contains(t, out.String(), "not compared: ledger/postgres.New (this build only)")

	slower := strings.ReplaceAll(headRounds, "250000 ns/op", "260000 ns/op")
	cs, _, err = compare(mustParse(t, baseRounds), mustParse(t, slower))
	require.NoError(t, err)
	require.InDelta(t, 1.04, cs[1].median, 1e-9)
	out.Reset()
	reportComparison(&out, cs, nil)
	require.Contains(t, out.String(), "median 1.04: SLOWER than the base")
}

// A round missing from one build, or two builds with no benchmark in common, cannot be
// compared: the error says which.
func TestCompareRefusesWhatCannotBePaired(t *testing.T) {
	short := strings.Join(strings.SplitAfter(headRounds, "\n")[:7], "")
	_, _, err := compare(mustParse(t, baseRounds), mustParse(t, short))
	require.ErrorContains(t, err, "ledger/postgres.PostgresGuardedCall has 3 samples at the base and 2 here")

	_, _, err = compare(mustParse(t, "BenchmarkA-2 1 5 ns/op\n"), mustParse(t, "BenchmarkB-2 1 5 ns/op\n"))
	require.ErrorContains(t, err, "no benchmark was measured in both builds")
}
