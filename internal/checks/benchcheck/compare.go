package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// comparison is one benchmark measured in two builds over the same rounds: the time per
// operation of the build under test divided by the base build's, per round.
type comparison struct {
	bench
	base, head []float64 // ns/op per round
	ratios     []float64 // head ÷ base per round
	median     float64
}

// compare pairs the ns/op samples of every benchmark that both builds ran, round by round
// (the k-th sample of each file is round k), and returns them ordered by package and name.
// The figures of b.ReportMetric are left out: they need not mean the same in two builds.
// It fails when no benchmark is in both, or when a benchmark has a different number of
// samples in the two (a round is missing, so the rounds cannot be paired: the error names
// the first such benchmark by name). Benchmarks only one build has are returned in only,
// for the caller to mention.
func compare(base, head map[bench][]float64) (cs []comparison, only []string, err error) {
	names := slices.SortedFunc(maps.Keys(head), func(a, b bench) int { return strings.Compare(a.String(), b.String()) })
	for _, b := range names {
		h := head[b]
		if strings.Contains(b.name, " ") {
			continue
		}
		s, ok := base[b]
		if !ok {
			only = append(only, b.String()+" (this build only)")
			continue
		}
		if len(s) != len(h) {
			return nil, nil, fmt.Errorf("%s has %d samples at the base and %d here: the rounds cannot be paired (did a round fail?)", b, len(s), len(h))
		}
		c := comparison{bench: b, base: s, head: h}
		for i := range h {
			c.ratios = append(c.ratios, h[i]/s[i])
		}
		c.median = median(c.ratios)
		cs = append(cs, c)
	}
	for b := range base {
		if _, ok := head[b]; !ok && !strings.Contains(b.name, " ") {
			only = append(only, b.String()+" (base only)")
		}
	}
	if len(cs) == 0 {
		return nil, nil, fmt.Errorf("no benchmark was measured in both builds")
	}
	slices.Sort(only)
	return cs, only, nil
}

// reportComparison writes each comparison: the times per round in both builds, the ratio
// per round, their median and whether the build under test is no slower than the base
// (median ratio ≤ 1.0), then the benchmarks only one build ran.
func reportComparison(w io.Writer, cs []comparison, only []string) {
	us := func(v []float64) string {
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = strconv.FormatFloat(x/1000, 'f', 1, 64)
		}
		return strings.Join(s, " ")
	}
	for _, c := range cs {
		verdict := "no slower than the base"
		if c.median > 1 {
			verdict = "SLOWER than the base"
		}
		ratios := make([]string, len(c.ratios))
		for i, r := range c.ratios {
			ratios[i] = strconv.FormatFloat(r, 'f', 2, 64)
		}
		fmt.Fprintf(w, "%s\n  base µs/op: %s\n  this µs/op: %s\n  this ÷ base per round: %s\n  median %.2f: %s\n",
			c, us(c.base), us(c.head), strings.Join(ratios, " "), c.median, verdict)
	}
	for _, o := range only {
		fmt.Fprintf(w, "not compared: %s\n", o)
	}
}
