package evals

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// CommandFunc returns the command that runs this binary in role "worker" or "sink" with
// args (the hidden `toolfence eval-worker` / `eval-sink` subcommands, or a re-exec of a
// test binary).
type CommandFunc func(role string, args ...string) *exec.Cmd

// proc is one child process: a worker or the sink.
type proc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	done    chan struct{}
	waitErr error

	mu sync.Mutex
	// reached holds, per barrier name, the trials (batch indexes) whose agent 0 passed it;
	// barChanged is closed and replaced whenever it grows.
	reached    map[string]map[int]bool
	barChanged chan struct{}
	results    []Belief
	stderr     bytes.Buffer
	first      string // first stdout line (the sink's URL)
	gotLine    chan struct{}
	// group: the process leads its own process group, and kill and signal reach all of it.
	group bool
}

// startProcGroup is startProc for a cmd started in its own process group
// (SysProcAttr.Setpgid): kill and signal then reach every process of the group.
func startProcGroup(cmd *exec.Cmd) (*proc, error) {
	p, err := startProc(cmd)
	if p != nil {
		p.group = true
	}
	return p, err
}

// startProc starts cmd with piped stdin (so a child never outlives the parent's interest)
// and collects its stdout protocol lines.
func startProc(cmd *exec.Cmd) (*proc, error) {
	p := &proc{cmd: cmd, done: make(chan struct{}), gotLine: make(chan struct{}),
		reached: map[string]map[int]bool{}, barChanged: make(chan struct{})}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = &lockedWriter{mu: &p.mu, w: &p.stderr}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("evals: starting %s: %w", cmd.Path, err)
	}
	p.stdin = stdin
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		firstLine := true
		for sc.Scan() {
			line := sc.Text()
			if firstLine {
				p.mu.Lock()
				p.first = line
				p.mu.Unlock()
				close(p.gotLine)
				firstLine = false
			}
			switch {
			case strings.HasPrefix(line, "BARRIER "):
				p.barrierLine(strings.TrimPrefix(line, "BARRIER "))
			case strings.HasPrefix(line, "RESULT "):
				var b Belief
				if json.Unmarshal([]byte(strings.TrimPrefix(line, "RESULT ")), &b) == nil {
					p.mu.Lock()
					p.results = append(p.results, b)
					p.mu.Unlock()
				}
			}
		}
		if firstLine {
			close(p.gotLine)
		}
	}()
	go func() {
		<-scanned
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// barrierLine records "<trial> <agent> <name>": agent 0 of trial passed name.
func (p *proc) barrierLine(rest string) {
	f := strings.Fields(rest)
	if len(f) != 3 || f[1] != "0" {
		return
	}
	k, err := strconv.Atoi(f[0])
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.reached[f[2]]
	if m == nil {
		m = map[int]bool{}
		p.reached[f[2]] = m
	}
	if !m[k] {
		m[k] = true
		close(p.barChanged)
		p.barChanged = make(chan struct{})
	}
}

// finished returns the trials whose agent 0 finished.
func (p *proc) finished() map[int]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[int]bool, len(p.reached[barrierDone]))
	for k := range p.reached[barrierDone] {
		out[k] = true
	}
	return out
}

// waitBarriers waits until agent 0 of each of n trials announced name or finished without
// it, and returns the trials that announced name. It fails (returning those that did) when
// the process exits first or the timeout passes.
func (p *proc) waitBarriers(name string, n int, timeout time.Duration) (map[int]bool, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	snapshot := func() (map[int]bool, int, chan struct{}) {
		p.mu.Lock()
		defer p.mu.Unlock()
		out := make(map[int]bool, len(p.reached[name]))
		for k := range p.reached[name] {
			out[k] = true
		}
		settled := len(out)
		for k := range p.reached[barrierDone] {
			if !out[k] {
				settled++
			}
		}
		return out, settled, p.barChanged
	}
	for {
		got, settled, ch := snapshot()
		if settled >= n {
			return got, nil
		}
		select {
		case <-ch:
		case <-p.done:
			got, _, _ = snapshot()
			return got, fmt.Errorf("worker exited before barrier %s (%d of %d trials reached it): %s", name, len(got), n, p.stderrTail())
		case <-t.C:
			got, _, _ = snapshot()
			return got, fmt.Errorf("%d of %d trials did not reach barrier %s within %v", n-len(got), n, name, timeout)
		}
	}
}

// kill SIGKILLs the process and waits for it.
func (p *proc) kill() {
	_ = p.signal(syscall.SIGKILL)
	_ = p.signal(syscall.SIGCONT) // a stopped process dies only once continued on some kernels
	<-p.done
}

// signal sends sig to the process, or to its whole group when it leads one.
func (p *proc) signal(sig syscall.Signal) error {
	if p.group {
		return syscall.Kill(-p.cmd.Process.Pid, sig)
	}
	return p.cmd.Process.Signal(sig)
}

// exitWithin waits up to timeout for the process to exit and reports whether it did; past
// timeout it kills it.
func (p *proc) exitWithin(timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		p.kill()
		return false
	}
}

// wait waits for the process to exit and returns its beliefs; past timeout it kills it.
func (p *proc) wait(timeout time.Duration) ([]Belief, error) {
	if !p.exitWithin(timeout) {
		return p.beliefs(), fmt.Errorf("worker ran past %v and was killed", timeout)
	}
	_ = p.stdin.Close()
	var ee *exec.ExitError
	if p.waitErr != nil && !errors.As(p.waitErr, &ee) {
		return p.beliefs(), p.waitErr
	}
	if p.cmd.ProcessState.ExitCode() != 0 {
		return p.beliefs(), fmt.Errorf("worker exited %d: %s", p.cmd.ProcessState.ExitCode(), p.stderrTail())
	}
	return p.beliefs(), nil
}

func (p *proc) beliefs() []Belief {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Belief(nil), p.results...)
}

func (p *proc) stderrTail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := strings.TrimSpace(p.stderr.String())
	if len(s) > 400 {
		s = "…" + s[len(s)-400:]
	}
	return s
}

// sinkClient drives the sink's control API.
type sinkClient struct {
	base string
	hc   *http.Client
}

// waitHeld long-polls until the sink holds the answer to intent's first request.
func (c sinkClient) waitHeld(ctx context.Context, intent string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout+time.Second)
	defer cancel()
	u := c.base + "/control/held?intent=" + url.QueryEscape(intent) + "&timeout=" + timeout.String()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("sink held nothing for %s (status %d)", intent, resp.StatusCode)
	}
	return nil
}

// release lets the held answer of intent go ("respond") or drops its connection ("drop").
func (c sinkClient) release(ctx context.Context, intent, action string) error {
	return c.postRelease(ctx, "intent", intent, action)
}

// releaseAll lets every held answer of an intent starting with prefix go ("respond") or
// drops their connections ("drop").
func (c sinkClient) releaseAll(ctx context.Context, prefix, action string) error {
	return c.postRelease(ctx, "prefix", prefix, action)
}

// postRelease posts /control/release with by=value and action.
func (c sinkClient) postRelease(ctx context.Context, by, value, action string) error {
	u := c.base + "/control/release?" + by + "=" + url.QueryEscape(value) + "&action=" + action
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// heldIntents long-polls until the sink holds the answers of at least n intents whose
// name starts with prefix (n 0: it answers at once) and returns the intents it holds, with
// an error when the timeout passed first.
func (c sinkClient) heldIntents(ctx context.Context, prefix string, n int, timeout time.Duration) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout+5*time.Second)
	defer cancel()
	u := c.base + "/control/held?prefix=" + url.QueryEscape(prefix) + "&n=" + strconv.Itoa(n) + "&timeout=" + max(timeout, time.Millisecond).String()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var ans struct {
		Held    int      `json:"held"`
		Intents []string `json:"intents"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(ans.Intents))
	for _, in := range ans.Intents {
		out[in] = true
	}
	if resp.StatusCode != http.StatusOK {
		return out, fmt.Errorf("the sink holds %d of %d answers for %s (status %d)", ans.Held, n, prefix, resp.StatusCode)
	}
	return out, nil
}
