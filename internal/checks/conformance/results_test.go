package conformance

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// check is one entry of a scenario's checks.json, as the suite writes it.
type check struct {
	ID           string `json:"id"`
	Description  string `json:"description"`
	Status       string `json:"status"`
	ErrorMessage string `json:"errorMessage"`
}

// passed says the suite counts the check as passed: SUCCESS.
func (c check) passed() bool { return c.Status == "SUCCESS" }

// failed says the suite counts the check against the implementation: FAILURE, or WARNING
// (a SHOULD not met; the suite's own baselines treat it as a failure too). INFO and SKIPPED
// are neither.
func (c check) failed() bool { return c.Status == "FAILURE" || c.Status == "WARNING" }

// outcome is how a report shows the check: its status and error message.
func (c check) outcome() string {
	if c.ErrorMessage == "" {
		return c.Status
	}
	return c.Status + ": " + oneLine(c.ErrorMessage)
}

// results are the checks of one run of the suite.
type results struct {
	// checks are by key: "SCENARIO | ID | DESCRIPTION", with " #N" appended to the N-th
	// (N ≥ 2) check of a scenario with that id and description (the suite reports some
	// checks several times, in a fixed order).
	checks map[string]check
	// broken are the scenarios that ran and wrote no checks.json, with the suite's message.
	broken map[string]string
}

// resultDir is the name of a scenario's result directory: [PREFIX]SCENARIO-TIMESTAMP.
var resultDir = regexp.MustCompile(`^(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$`)

// failedToRun is the suite's line for a scenario that threw before writing its checks.
var failedToRun = regexp.MustCompile(`(?m)^Failed to run scenario (\S+): (.*)$`)

// readResults reads the checks.json of every scenario directory in dir (the suite's -o of one
// run; prefix is what the suite puts before a scenario's name: "server-" for server
// scenarios, "" for client scenarios) into r. A directory without checks.json makes its
// scenario broken, with the suite's message about it from output. It fails on an entry that
// is no scenario directory, a scenario met twice and a checks.json that does not parse.
func (r *results) readResults(dir, prefix, output string) error {
	if r.checks == nil {
		r.checks, r.broken = map[string]check{}, map[string]string{}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, e := range entries {
		m := resultDir.FindStringSubmatch(e.Name())
		scenario := ""
		if m != nil && strings.HasPrefix(m[1], prefix) {
			scenario = strings.TrimPrefix(m[1], prefix)
		}
		if !e.IsDir() || scenario == "" {
			return fmt.Errorf("%s: %s is not a result directory %sSCENARIO-TIMESTAMP", dir, e.Name(), prefix)
		}
		if seen[scenario] {
			return fmt.Errorf("%s: scenario %s has two result directories", dir, scenario)
		}
		seen[scenario] = true
		var checks []check
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "checks.json"))
		if errors.Is(err, fs.ErrNotExist) {
			r.broken[scenario] = "the suite wrote no checks.json for it"
			for _, m := range failedToRun.FindAllStringSubmatch(output, -1) {
				if m[1] == scenario {
					r.broken[scenario] = "the suite failed to run it: " + m[2]
				}
			}
			continue
		}
		if err == nil {
			err = json.Unmarshal(b, &checks)
		}
		if err != nil {
			return fmt.Errorf("scenario %s: %w", scenario, err)
		}
		repeats := map[string]int{}
		for _, c := range checks {
			key := scenario + " | " + c.ID + " | " + oneLine(c.Description)
			repeats[key]++
			if n := repeats[key]; n > 1 {
				key += fmt.Sprintf(" #%d", n)
			}
			if _, dup := r.checks[key]; dup {
				return fmt.Errorf("%s: check %q met twice", dir, key)
			}
			r.checks[key] = c
		}
	}
	return nil
}

// scenarioOf returns the scenario of a key.
func scenarioOf(key string) string {
	scenario, _, _ := strings.Cut(key, " | ")
	return scenario
}

// counts says how many checks passed, failed and were neither (INFO, SKIPPED).
func (r results) counts() string {
	var pass, fail int
	for _, c := range r.checks {
		pass += b2i(c.passed())
		fail += b2i(c.failed())
	}
	s := fmt.Sprintf("%d passed, %d failed, %d neither (INFO/SKIPPED)", pass, fail, len(r.checks)-pass-fail)
	if len(r.broken) > 0 {
		s += fmt.Sprintf(", %d scenario(s) without results", len(r.broken))
	}
	return s
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// oneLine collapses runs of white space, newlines included, to one space.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// baseline is the checked-in list of the checks that fail where they may: for each run name
// ("direct 2026-07-28", "serve 2025-11-25", "client direct"), each failing check's key and
// why it fails.
type baseline map[string]map[string]expectation

// expectation is why a check of the baseline fails, and whether it fails only sometimes.
type expectation struct {
	reason string
	// flaky: the check fails in some runs and passes in others, so passing is no staleness.
	flaky bool
}

// baselineGroup is one entry of the baseline file: a reason and the keys of the checks it
// explains; flaky when they fail only in some runs.
type baselineGroup struct {
	Reason string   `yaml:"reason"`
	Flaky  bool     `yaml:"flaky"`
	Checks []string `yaml:"checks"`
}

// loadBaseline reads the baseline file at path: a YAML map from run name (one of runs) to a
// list of groups {reason, flaky, checks}. It fails, naming the problem, on an unknown run
// name or field, a group without a reason or checks, and a check listed twice for a run.
func loadBaseline(path string, runs []string) (baseline, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var file map[string][]baselineGroup
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil && !errors.Is(err, errEOF) {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := baseline{}
	for run, groups := range file {
		if !slices.Contains(runs, run) {
			return nil, fmt.Errorf("%s: unknown run %q (the runs are %q)", path, run, runs)
		}
		out[run] = map[string]expectation{}
		for i, g := range groups {
			if strings.TrimSpace(g.Reason) == "" || len(g.Checks) == 0 {
				return nil, fmt.Errorf("%s: %s, group %d: each group needs a reason and its checks", path, run, i+1)
			}
			for _, key := range g.Checks {
				if _, dup := out[run][key]; dup {
					return nil, fmt.Errorf("%s: %s lists %q twice", path, run, key)
				}
				out[run][key] = expectation{reason: oneLine(g.Reason), flaky: g.Flaky}
			}
		}
	}
	return out, nil
}

// errEOF is what the YAML decoder answers for an empty file.
var errEOF = func() error {
	var v any
	return yaml.NewDecoder(strings.NewReader("")).Decode(&v)
}()

// section is what a report says about one run: its name, its counts and its problems.
type section struct {
	title    string
	counts   string
	problems []string
}

// report is the verdict of one comparison, section by section.
type report []section

// failed says some section has a problem.
func (r report) failed() bool {
	return slices.ContainsFunc(r, func(s section) bool { return len(s.problems) > 0 })
}

// String lists every section with its counts and, under it, its problems.
func (r report) String() string {
	var b strings.Builder
	for _, s := range r {
		fmt.Fprintf(&b, "%s: %s; %d problem(s)\n", s.title, s.counts, len(s.problems))
		for _, p := range s.problems {
			fmt.Fprintf(&b, "    %s\n", p)
		}
	}
	return b.String()
}

// againstBaseline is the section of a run whose failures the baseline must list (the direct
// runs, serve): a failing check the baseline does not name is a problem, and so is a
// scenario without results, a baseline entry (expect, with the run's name) whose check is no
// longer reported, and one not flaky whose check passes now or is neither passed nor failed.
func againstBaseline(title, name string, got results, expect map[string]expectation) section {
	s := section{title: title, counts: got.counts()}
	for _, scenario := range slices.Sorted(maps.Keys(got.broken)) {
		s.problems = append(s.problems, fmt.Sprintf("✗ scenario %s has no results: %s", scenario, got.broken[scenario]))
	}
	for _, key := range slices.Sorted(maps.Keys(got.checks)) {
		if _, listed := expect[key]; got.checks[key].failed() && !listed {
			s.problems = append(s.problems, fmt.Sprintf("✗ %s → %s (not in the baseline under %q)", key, got.checks[key].outcome(), name))
		}
	}
	for _, key := range slices.Sorted(maps.Keys(expect)) {
		c, ok := got.checks[key]
		switch {
		case !ok:
			s.problems = append(s.problems, fmt.Sprintf("stale baseline entry under %q: %s is no longer reported (reason given: %s)", name, key, expect[key].reason))
		case !c.failed() && !expect[key].flaky:
			s.problems = append(s.problems, fmt.Sprintf("stale baseline entry under %q: %s → %s now (reason given: %s)", name, key, c.outcome(), expect[key].reason))
		}
	}
	return s
}

// againstDirect is the section of a run through the proxy: every check that passed directly
// must pass through it, and none may fail through it that did not fail directly. A check
// that passed directly and failed, was neither, or was not reported through the proxy is a
// problem; so is one failing through the proxy that was neither or not reported directly.
//
// expect (the baseline under the arrangement's name) may list checks that fail only through
// the proxy, each with its reason, never one that passes directly: such a listed failure is
// no problem; an entry whose check passes directly, does not fail through the proxy now
// (unless flaky) or is no longer reported is.
func againstDirect(title, name string, direct, via results, expect map[string]expectation) section {
	s := section{title: title, counts: via.counts()}
	for _, key := range slices.Sorted(maps.Keys(expect)) {
		d := direct.checks[key]
		c, ok := via.checks[key]
		switch {
		case d.passed():
			s.problems = append(s.problems, fmt.Sprintf("baseline entry under %q lists %s, which passes directly: a check that passes directly must pass through the proxy", name, key))
		case !ok:
			s.problems = append(s.problems, fmt.Sprintf("stale baseline entry under %q: %s is no longer reported (reason given: %s)", name, key, expect[key].reason))
		case !c.failed() && !expect[key].flaky:
			s.problems = append(s.problems, fmt.Sprintf("stale baseline entry under %q: %s → %s now (reason given: %s)", name, key, c.outcome(), expect[key].reason))
		}
	}
	keys := slices.Sorted(maps.Keys(direct.checks))
	for _, key := range slices.Sorted(maps.Keys(via.checks)) {
		if _, ok := direct.checks[key]; !ok {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	for _, key := range keys {
		d, inDirect := direct.checks[key]
		c, inVia := via.checks[key]
		switch {
		case d.passed() && !inVia && via.broken[scenarioOf(key)] != "":
			s.problems = append(s.problems, fmt.Sprintf("✗ %s → not reported through the proxy: %s (passes directly)", key, via.broken[scenarioOf(key)]))
		case d.passed() && !inVia:
			s.problems = append(s.problems, fmt.Sprintf("✗ %s → not reported through the proxy (passes directly)", key))
		case d.passed() && !c.passed():
			s.problems = append(s.problems, fmt.Sprintf("✗ %s → %s (passes directly)", key, c.outcome()))
		case c.failed() && !d.failed() && expect[key].reason != "":
			// A known failure of the proxy's own, listed with its reason.
		case c.failed() && !inDirect:
			s.problems = append(s.problems, fmt.Sprintf("✗ %s → %s (fails only through the proxy: not reported directly)", key, c.outcome()))
		case c.failed() && !d.failed():
			s.problems = append(s.problems, fmt.Sprintf("✗ %s → %s (fails only through the proxy: %s directly)", key, c.outcome(), d.Status))
		}
	}
	return s
}
