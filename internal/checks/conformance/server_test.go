package conformance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// baselineFile lists the checks that fail directly or against serve, each with its reason.
const baselineFile = "testdata/baseline.yaml"

// requirement is one requirement set of the suite and the everything-server that serves it.
type requirement struct {
	name      string
	stateless bool // the everything-server's mode: stateless serves 2026-07-28, stateful 2025-11-25
}

var requirements = []requirement{{"2026-07-28", true}, {"2025-11-25", false}}

// baselineRuns are the runs the baseline lists failing checks of.
var baselineRuns = []string{"direct 2026-07-28", "direct 2025-11-25", "serve 2026-07-28", "serve 2025-11-25",
	"client direct 2026-07-28", "client direct 2025-11-25",
	"proxy-http 2026-07-28", "proxy-http 2025-11-25", "proxy-stdio 2026-07-28", "proxy-stdio 2025-11-25",
	"client proxy 2026-07-28", "client proxy 2025-11-25"}

// target is one server the suite runs against: it starts what the run needs in dir and
// returns the URL of the MCP endpoint and how to stop it all.
type target struct {
	id, name string
	start    func(dir string, req requirement) (url string, stop func() string, err error)
}

// direct is the go-sdk's everything-server, stateless for 2026-07-28, stateful for 2025-11-25.
var direct = target{"direct", "direct (everything-server)", func(dir string, req requirement) (string, func() string, error) {
	p, url, err := startEverything(req.stateless)
	if err != nil {
		return "", nil, err
	}
	return url, stopAll(dir, p), nil
}}

// repeats are the proxy's flags for the suite's identical calls: the suite makes the same
// call (tool and arguments) in several scenarios, on purpose, soon after one another and
// without elicitation, as a client that means each one does; --repeat-window 0 sends such a
// call again once the earlier answer reached the host, as a user running such a client
// would set it (docs/proxy.md "The same call again"). Retries of answers that never
// arrived are still answered from the ledger.
var repeats = []string{"--repeat-window", "0"}

// proxies are the arrangements of toolfence proxy in front of the everything-server; each
// run gets a fresh store.
var proxies = []target{
	{"proxy-http", "proxy, HTTP upstream (--http, --upstream everything-server)", func(dir string, req requirement) (string, func() string, error) {
		up, upURL, err := startEverything(req.stateless)
		if err != nil {
			return "", nil, err
		}
		p, url, err := startProc(append([]string{toolfenceBin, "proxy", "--http", "127.0.0.1:0", "--store", filepath.Join(dir, "store"),
			"--server-id", "ev", "--upstream", upURL}, repeats...), true)
		if err != nil {
			stopAll(dir, up)()
			return "", nil, err
		}
		return url, stopAll(dir, p, up), nil
	}},
	{"proxy-stdio", "proxy, stdio upstream (--http, -- everything-server)", func(dir string, _ requirement) (string, func() string, error) {
		p, url, err := startProc(append(append([]string{toolfenceBin, "proxy", "--http", "127.0.0.1:0", "--store", filepath.Join(dir, "store"),
			"--server-id", "ev"}, repeats...), "--", everythingBin), true)
		if err != nil {
			return "", nil, err
		}
		return url, stopAll(dir, p), nil
	}},
}

// serve is toolfence serve over HTTP: toolfence's own tools, none of the suite's fixtures.
var serve = target{"serve", "serve (toolfence serve --http)", func(dir string, _ requirement) (string, func() string, error) {
	p, url, err := startProc([]string{toolfenceBin, "serve", "--http", "127.0.0.1:0", "--store", filepath.Join(dir, "store")}, true)
	if err != nil {
		return "", nil, err
	}
	return url, stopAll(dir, p), nil
}}

// stopAll returns what stops ps in order and writes each one's stderr to dir/NAME.stderr.
// It returns the last stderr lines of those that had exited before (a crash), "" if none.
func stopAll(dir string, ps ...*proc) func() string {
	return func() string {
		var logs []string
		for i, p := range ps {
			name := fmt.Sprintf("%d-%s", i, filepath.Base(p.cmd.Path))
			if crashed := p.stop(); crashed {
				logs = append(logs, fmt.Sprintf("--- %s exited during the run (%s); its last stderr lines:\n%s", name, p.cmd.ProcessState, tail(p.stderr(), 30)))
			}
			_ = os.WriteFile(filepath.Join(dir, name+".stderr"), []byte(p.stderr()), 0o644)
		}
		return strings.Join(logs, "\n")
	}
}

// serverRun is the outcome of the suite's server scenarios against one target.
type serverRun struct {
	results results
	logs    string // the last stderr lines of the target's processes that exited during the run
	err     error
}

// runServer starts tg for req, runs the suite's server scenarios of req against it and reads
// the results.
func runServer(t *testing.T, s suiteCLI, tg target, req requirement) serverRun {
	dir := outDir(t, req.name+"-"+tg.id)
	url, stop, err := tg.start(dir, req)
	if err != nil {
		return serverRun{err: fmt.Errorf("%s: %w", tg.name, err)}
	}
	out := filepath.Join(dir, "out")
	output, err := s.run(context.Background(), dir, nil, "server", "--url", url, "--requirements", req.name, "-o", out)
	run := serverRun{logs: stop(), err: err}
	if err == nil {
		run.err = run.results.readResults(out, "server-", output)
	}
	return run
}

// TestServerSuite runs the suite's server scenarios of each requirement set directly against
// the everything-server, through toolfence proxy in each arrangement, and against toolfence
// serve, and compares check by check: every check that passes directly passes through the
// proxy; the checks that fail directly and against serve are those of the baseline, each
// with its reason, and no baseline entry is stale. The failure lists every offending check
// with its message, grouped by run, with each run's counts.
func TestServerSuite(t *testing.T) {
	t.Parallel()
	s, base := suite(t)
	for _, req := range requirements {
		t.Run(req.name, func(t *testing.T) {
			t.Parallel()
			targets := append([]target{direct, serve}, proxies...)
			runs := make([]serverRun, len(targets))
			var wg sync.WaitGroup
			for i, tg := range targets {
				wg.Go(func() { runs[i] = runServer(t, s, tg, req) })
			}
			wg.Wait()
			for i, r := range runs {
				if r.err != nil {
					t.Fatalf("%s: %v\n%s", targets[i].name, r.err, r.logs)
				}
			}
			rep := report{
				againstBaseline(direct.name, "direct "+req.name, runs[0].results, base["direct "+req.name]),
				againstBaseline(serve.name, "serve "+req.name, runs[1].results, base["serve "+req.name]),
			}
			for i, tg := range proxies {
				rep = append(rep, againstDirect(tg.name, tg.id+" "+req.name, runs[0].results, runs[2+i].results, base[tg.id+" "+req.name]))
			}
			var crashes []string
			for i, r := range runs {
				if r.logs != "" {
					crashes = append(crashes, targets[i].name+":\n"+r.logs)
				}
			}
			if !rep.failed() && len(crashes) == 0 {
				t.Logf("requirements %s:\n%s", req.name, rep)
				return
			}
			t.Errorf("the MCP conformance suite, requirements %s, differs (baseline: %s; docs/testing.md):\n%s%s\n%s",
				req.name, baselineFile, rep, strings.Join(crashes, "\n"), keepHint)
		})
	}
}
