// Command benchcheck reads `go test -bench` output holding several rounds of the project's
// benchmarks and judges the performance targets of docs/benchmarks.md: each target is a ratio
// between two benchmarks of the same round (or a bound on one), never an absolute time.
//
// Usage:
//
//	go run ./internal/checks/benchcheck bench.out
//	go run ./internal/checks/benchcheck -base base.out head.out
//
// It prints, for every target, the value of each round, their median, how many rounds met
// it and the verdict (met when the median does). It exits 1 when a target's benchmarks are
// missing or the input holds no benchmark, 2 on a usage or read error, and 0 otherwise, missed
// targets included: the verdict is printed, the figures are for people to record.
//
// With -base it compares two builds instead (`make benchvs`): base.out and head.out hold the
// same benchmarks of an older build and of this one, run in interleaved rounds, and it
// prints for every benchmark in both the time per round, this build's ÷ the base's per
// round and their median, which says whether this build is slower. It exits 1 when the
// rounds cannot be paired or no benchmark is in both.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// module is the import path prefix that benchmark package lines carry.
const module = "github.com/toolfence/toolfence/"

// bench names one benchmark: its package below the module and its name without the
// "Benchmark" prefix and without the GOMAXPROCS suffix.
type bench struct{ pkg, name string }

func (b bench) String() string { return b.pkg + "." + b.name }

// target is a performance target: num / (scale × den) compared with limit, per round, or
// (num − minus) / (scale × den) when minus is set (what one call adds to another); a
// target without den bounds num's ns/op itself, or the figure num names after a space
// (a unit of b.ReportMetric).
type target struct {
	issue  int
	what   string
	num    bench
	den    bench // zero: a bound on num alone, in ns/op
	scale  float64
	atMost bool // the value must be ≤ limit (else ≥ limit)
	limit  float64
	// reference marks a figure printed beside the targets for comparison, with no verdict.
	reference bool
	minus     bench // zero: none
}

// targets are the ones the issues set (see docs/benchmarks.md).
var targets = []target{
	{2, "guarded call ≤ 1.5 × two fsyncs (GuardedCall / (2 × FsyncFloor))",
		bench{"interceptor", "GuardedCall"}, bench{"interceptor", "FsyncFloor"}, 2, true, 1.5, false, bench{}},
	{2, "group commit ≥ 2 × sync writes at ~64 callers (ParallelSyncWrites / GuardedCallParallel)",
		bench{"interceptor", "GuardedCallParallelSyncWrites"}, bench{"interceptor", "GuardedCallParallel"}, 1, false, 2, false, bench{}},
	{2, "replay ≤ 10 µs (Replay, ns/op)",
		bench{"interceptor", "Replay"}, bench{}, 1, true, 10_000, false, bench{}},
	{3, "sequential guarded call ≤ 1.0 × naive baseline (PostgresGuardedCall / NaiveBaseline)",
		bench{"ledger/postgres", "PostgresGuardedCall"}, bench{"ledger/postgres", "NaiveBaseline"}, 1, true, 1.0, false, bench{}},
	{3, "reference: sequential guarded call ÷ the minimal naive table (PostgresGuardedCall / NaiveBaselineMinimal)",
		bench{"ledger/postgres", "PostgresGuardedCall"}, bench{"ledger/postgres", "NaiveBaselineMinimal"}, 1, true, 1.0, true, bench{}},
	{3, "throughput at 8 callers ≥ 3.2 × sequential (PostgresGuardedCall / PostgresGuardedCallParallel/callers=8)",
		bench{"ledger/postgres", "PostgresGuardedCall"}, bench{"ledger/postgres", "PostgresGuardedCallParallel/callers=8"}, 1, false, 3.2, false, bench{}},
	{3, "throughput at 64 callers ≥ 4.5 × sequential (PostgresGuardedCall / PostgresGuardedCallParallel/callers=64)",
		bench{"ledger/postgres", "PostgresGuardedCall"}, bench{"ledger/postgres", "PostgresGuardedCallParallel/callers=64"}, 1, false, 4.5, false, bench{}},
	{3, "reference: write amplification, index entries written per guarded call at 64 callers (PostgreSQL's statistics; 9 since schema version 6)",
		bench{"ledger/postgres", "PostgresGuardedCallParallel/callers=64 index-entries/op"}, bench{}, 1, true, 9, true, bench{}},
	{3, "reference: HOT updates of the residuals at 64 callers, % of their updates (a commit that settles is not HOT while an index names the state)",
		bench{"ledger/postgres", "PostgresGuardedCallParallel/callers=64 HOT-%"}, bench{}, 1, false, 0, true, bench{}},
	{27, "reference: the residual table's secondary indexes, the sequential call: all ÷ the primary key alone (PostgresIndexCost/indexes=all ÷ indexes=primary-key)",
		bench{"ledger/postgres", "PostgresIndexCost/indexes=all/sequential"}, bench{"ledger/postgres", "PostgresIndexCost/indexes=primary-key/sequential"}, 1, true, 1.0, true, bench{}},
	{27, "reference: the three filter indexes, the sequential call: all ÷ the primary key and the open residuals' index (PostgresIndexCost/indexes=all ÷ indexes=primary-key+open)",
		bench{"ledger/postgres", "PostgresIndexCost/indexes=all/sequential"}, bench{"ledger/postgres", "PostgresIndexCost/indexes=primary-key+open/sequential"}, 1, true, 1.0, true, bench{}},
	{27, "reference: the residual table's secondary indexes, 8 callers: all ÷ the primary key alone (PostgresIndexCost/indexes=all ÷ indexes=primary-key)",
		bench{"ledger/postgres", "PostgresIndexCost/indexes=all/callers=8"}, bench{"ledger/postgres", "PostgresIndexCost/indexes=primary-key/callers=8"}, 1, true, 1.0, true, bench{}},
	{27, "reference: the three filter indexes, 8 callers: all ÷ the primary key and the open residuals' index (PostgresIndexCost/indexes=all ÷ indexes=primary-key+open)",
		bench{"ledger/postgres", "PostgresIndexCost/indexes=all/callers=8"}, bench{"ledger/postgres", "PostgresIndexCost/indexes=primary-key+open/callers=8"}, 1, true, 1.0, true, bench{}},
	{27, "reference: the open residuals' index (it makes commits non-HOT), 8 callers: all ÷ the primary key and the filter indexes (PostgresIndexCost/indexes=all ÷ indexes=primary-key+filters)",
		bench{"ledger/postgres", "PostgresIndexCost/indexes=all/callers=8"}, bench{"ledger/postgres", "PostgresIndexCost/indexes=primary-key+filters/callers=8"}, 1, true, 1.0, true, bench{}},
	{27, "reference: the filter indexes with HOT commits, 8 callers: ÷ the primary key alone (PostgresIndexCost/indexes=primary-key+filters ÷ indexes=primary-key)",
		bench{"ledger/postgres", "PostgresIndexCost/indexes=primary-key+filters/callers=8"}, bench{"ledger/postgres", "PostgresIndexCost/indexes=primary-key/callers=8"}, 1, true, 1.0, true, bench{}},
	{25, "a bypassed call ≤ 1.05 × the relay floor, 2026-07-28 host (ProxyBypassed / RelayFloor)",
		bench{"internal/checks/proxybench", "ProxyBypassed/rev=2026-07-28"}, bench{"internal/checks/proxybench", "RelayFloor/rev=2026-07-28"}, 1, true, 1.05, false, bench{}},
	{25, "a protected call ≤ 1.2 × the same call guarded in-process, 2026-07-28 host (ProxyProtected / GuardedUpstreamCall)",
		bench{"internal/checks/proxybench", "ProxyProtected/rev=2026-07-28"}, bench{"internal/checks/proxybench", "GuardedUpstreamCall/rev=2026-07-28"}, 1, true, 1.2, false, bench{}},
	{25, "a bypassed call ≤ 1.05 × the relay floor, 2025-11-25 host (ProxyBypassed / RelayFloor)",
		bench{"internal/checks/proxybench", "ProxyBypassed/rev=2025-11-25"}, bench{"internal/checks/proxybench", "RelayFloor/rev=2025-11-25"}, 1, true, 1.05, false, bench{}},
	{25, "a protected call ≤ 1.2 × the same call guarded in-process, 2025-11-25 host (ProxyProtected / GuardedUpstreamCall)",
		bench{"internal/checks/proxybench", "ProxyProtected/rev=2025-11-25"}, bench{"internal/checks/proxybench", "GuardedUpstreamCall/rev=2025-11-25"}, 1, true, 1.2, false, bench{}},
	{13, "reference: the proxy adds this many guarded calls, 2026-07-28 host ((ProxyProtected − Direct) / GuardedCall)",
		bench{"internal/checks/proxybench", "ProxyProtected/rev=2026-07-28"}, bench{"internal/checks/proxybench", "GuardedCall"}, 1, true, 1.5, true,
		bench{"internal/checks/proxybench", "Direct/rev=2026-07-28"}},
	{13, "reference: a sync a millisecond after the last ÷ back-to-back syncs (FsyncSpaced / FsyncBackToBack)",
		bench{"internal/checks/proxybench", "FsyncSpaced"}, bench{"internal/checks/proxybench", "FsyncBackToBack"}, 1, true, 1.10, true, bench{}},
	{13, "reference: a byte relay process (io.Copy each way) ÷ the direct call, 2026-07-28 host (RelayFloor / Direct)",
		bench{"internal/checks/proxybench", "RelayFloor/rev=2026-07-28"}, bench{"internal/checks/proxybench", "Direct/rev=2026-07-28"}, 1, true, 1.10, true, bench{}},
}

// parse reads benchmark output and returns the ns/op samples of every benchmark in the order
// they appear: the k-th sample of each benchmark belongs to round k. The other figures of a
// result line (b.ReportMetric's) are samples of their own, named after the benchmark and the
// unit: "PostgresGuardedCall index-entries/op". Lines that are not benchmark results are
// skipped; a result line with an unreadable ns/op is an error.
func parse(r io.Reader) (map[bench][]float64, error) {
	samples := map[bench][]float64{}
	pkg := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimPrefix(strings.TrimSpace(p), module)
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || f[3] != "ns/op" {
			continue
		}
		name := strings.TrimPrefix(f[0], "Benchmark")
		if i := strings.LastIndexByte(name, '-'); i > 0 && isDigits(name[i+1:]) {
			name = name[:i]
		}
		ns, err := strconv.ParseFloat(f[2], 64)
		if err != nil || ns <= 0 {
			return nil, fmt.Errorf("line %d: %q is not a time per operation", n, f[2])
		}
		b := bench{pkg, name}
		samples[b] = append(samples[b], ns)
		for i := 4; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				m := bench{pkg, name + " " + f[i+1]}
				samples[m] = append(samples[m], v)
			}
		}
	}
	return samples, sc.Err()
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// result is a target judged over the rounds of one run.
type result struct {
	target
	values []float64 // one per round
	median float64
	met    int // rounds that met the target
}

// ok reports whether v meets t.
func (t target) ok(v float64) bool {
	if t.atMost {
		return v <= t.limit
	}
	return v >= t.limit
}

// judge computes t over the rounds of samples. Rounds are paired by position, so it fails
// when the two benchmarks have a different number of samples (a round is missing one), and
// when a benchmark of t has no sample.
func judge(t target, samples map[bench][]float64) (result, error) {
	num := lookup(samples, t.num)
	if len(num) == 0 {
		return result{}, fmt.Errorf("%s: not measured", t.num)
	}
	r := result{target: t}
	if t.den == (bench{}) {
		r.values = slices.Clone(num)
	} else {
		den := lookup(samples, t.den)
		if len(den) == 0 {
			return result{}, fmt.Errorf("%s: not measured", t.den)
		}
		if len(num) != len(den) {
			return result{}, fmt.Errorf("%s has %d samples and %s %d: the rounds cannot be paired (did a round fail?)", t.num, len(num), t.den, len(den))
		}
		minus := make([]float64, len(num))
		if t.minus != (bench{}) {
			minus = lookup(samples, t.minus)
			if len(minus) == 0 {
				return result{}, fmt.Errorf("%s: not measured", t.minus)
			}
			if len(minus) != len(num) {
				return result{}, fmt.Errorf("%s has %d samples and %s %d: the rounds cannot be paired (did a round fail?)", t.num, len(num), t.minus, len(minus))
			}
		}
		for i := range num {
			r.values = append(r.values, (num[i]-minus[i])/(t.scale*den[i]))
		}
	}
	for _, v := range r.values {
		if t.ok(v) {
			r.met++
		}
	}
	r.median = median(r.values)
	return r, nil
}

// lookup returns the samples of b. Output cut down to its result lines names no package:
// there a benchmark is found by name alone, as long as only one package has that name.
func lookup(samples map[bench][]float64, b bench) []float64 {
	if s, ok := samples[b]; ok {
		return s
	}
	var found []float64
	n := 0
	for k, s := range samples {
		if k.name == b.name {
			found, n = s, n+1
		}
	}
	if n == 1 {
		return found
	}
	return nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// report writes the judgement of every target to w and returns the targets that could not
// be judged.
func report(w io.Writer, samples map[bench][]float64) error {
	var errs []error
	for _, t := range targets {
		r, err := judge(t, samples)
		if err != nil {
			fmt.Fprintf(w, "issue %d  %s\n  NOT MEASURED: %v\n", t.issue, t.what, err)
			errs = append(errs, err)
			continue
		}
		verdict := "MISSED"
		switch {
		case t.reference:
			verdict = "reference only, no target"
		case t.ok(r.median):
			verdict = "met"
		}
		vals := make([]string, len(r.values))
		for i, v := range r.values {
			vals[i] = format(t, v)
		}
		fmt.Fprintf(w, "issue %d  %s\n  rounds: %s\n  median %s, met in %d of %d rounds: %s\n",
			t.issue, t.what, strings.Join(vals, " "), format(t, r.median), r.met, len(r.values), verdict)
	}
	return errors.Join(errs...)
}

func format(t target, v float64) string {
	if _, unit, ok := strings.Cut(t.num.name, " "); ok && t.den == (bench{}) {
		return strconv.FormatFloat(v, 'f', 2, 64) + " " + unit
	}
	if t.den == (bench{}) {
		return strconv.FormatFloat(v/1000, 'f', 2, 64) + "µs"
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func main() {
	base := flag.String("base", "", "compare with the benchmarks of an older build in this `file` (same benchmarks, same rounds) instead of judging the targets")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: benchcheck FILE\n       benchcheck -base BASEFILE FILE\n\nJudges the performance targets of docs/benchmarks.md on `go test -bench` output (several rounds),\nor, with -base, compares each benchmark of FILE with the same benchmark of BASEFILE round by round.")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	samples := read(flag.Arg(0))
	if *base == "" {
		if err := report(os.Stdout, samples); err != nil {
			os.Exit(1)
		}
		return
	}
	cs, only, err := compare(read(*base), samples)
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchcheck: %s against %s: %v\n", flag.Arg(0), *base, err)
		os.Exit(1)
	}
	reportComparison(os.Stdout, cs, only)
}

// read parses the benchmark output in file, and exits the program when it cannot be read
// (2) or holds no benchmark result (1).
func read(file string) map[bench][]float64 {
	f, err := os.Open(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchcheck:", err)
		os.Exit(2)
	}
	defer f.Close()
	samples, err := parse(f)
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchcheck: %s: %v\n", file, err)
		os.Exit(2)
	}
	if len(samples) == 0 {
		fmt.Fprintf(os.Stderr, "benchcheck: %s holds no benchmark result\n", file)
		os.Exit(1)
	}
	return samples
}
