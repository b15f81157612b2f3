package crashtest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RoleEnv names the environment variable that carries the child's role. It is set only in
// a child started by Start; a package's TestMain may check it to skip checks (goroutine
// leaks) that a killed child cannot pass.
const RoleEnv = "TOOLFENCE_CRASHTEST_ROLE"

// ChildTest is the name of the test function the child runs: every package that uses
// Start defines
//
//	func TestCrashChild(t *testing.T) { crashtest.Run(t, roles) }
//
// which returns at once in a normal test run.
const ChildTest = "TestCrashChild"

// markFD is the child's file descriptor for marks: a pipe to the parent, separate from
// stdout and stderr, so nothing else the child prints can be taken for a mark.
const markFD = 3

// awaitTimeout bounds Await when the test has no earlier deadline. It is generous on
// purpose: it only turns a hung child into a failure with its output, it never paces a test.
const awaitTimeout = 2 * time.Minute

// Role returns the role this process was started in by Start, or "" in a normal test run.
func Role() string { return os.Getenv(RoleEnv) }

// Run is the child's side, called from TestCrashChild: it runs the role named by RoleEnv,
// and returns at once in a normal test run (no role). An unknown role fails the test with
// the names it knows. A role announces its points with Mark and ends with Hang (or is
// killed before it returns); a failed require in it makes the child exit non-zero with the
// failure in its output, which Await reports.
func Run(t *testing.T, roles map[string]func(t *testing.T)) {
	role := Role()
	if role == "" {
		return
	}
	fn, ok := roles[role]
	if !ok {
		t.Fatalf("crashtest: unknown role %q (this package knows %q)", role, slices.Sorted(maps.Keys(roles)))
	}
	fn(t)
}

var (
	markMu  sync.Mutex
	markOut = sync.OnceValue(func() *os.File { return os.NewFile(markFD, "crashtest-marks") })
)

// Mark announces in the child that it reached point, with an optional detail (an address,
// an id, a JSON line) that Await returns to the parent. It returns once the mark is in the
// pipe to the parent: call it only after the step it acknowledges has returned. Outside a
// child started by Start, or if the pipe is gone, it prints the problem on stderr and
// exits the process with status 2.
func Mark(point, detail string) {
	if Role() == "" {
		fmt.Fprintf(os.Stderr, "crashtest: Mark(%q) outside a child started by crashtest.Start\n", point)
		os.Exit(2)
	}
	if point == "" || strings.ContainsAny(point, " \n") || strings.Contains(detail, "\n") {
		fmt.Fprintf(os.Stderr, "crashtest: Mark(%q, %q): the point must be one word and the detail one line\n", point, detail)
		os.Exit(2)
	}
	line := point
	if detail != "" {
		line += " " + detail
	}
	markMu.Lock()
	defer markMu.Unlock()
	if _, err := markOut().WriteString(line + "\n"); err != nil {
		fmt.Fprintf(os.Stderr, "crashtest: Mark(%q): %v\n", point, err)
		os.Exit(2)
	}
}

// Hang blocks the child until it is killed. It never returns: if the parent goes away
// instead (its end of the child's stdin closes), the child exits with status 3.
func Hang() {
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(3)
}

// Child is a running child process started by Start. Its methods must be called from the
// test's goroutine.
type Child struct {
	t     testing.TB
	role  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *lockedBuffer
	marks chan string // lines from the mark pipe; closed at EOF
	seen  []string    // marks Await passed over, for failure messages
	done  chan struct{}
	err   error // cmd.Wait's error, once done is closed
}

// Start starts the test binary as a child that runs TestCrashChild in role, with env
// (KEY=value entries) added to this process's environment. The child's stdout and stderr
// are kept for failure messages; its stdin stays open until the test ends, so Hang
// returns only if the parent dies. At cleanup a child still running is SIGKILLed and
// reaped, and the output of a child of a failed test is logged. Start fails the test if
// the child cannot be started.
func Start(t testing.TB, role string, env ...string) *Child {
	t.Helper()
	if role == "" {
		t.Fatal("crashtest: Start needs a role")
	}
	c := &Child{t: t, role: role, out: &lockedBuffer{}, marks: make(chan string, 64), done: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^"+ChildTest+"$", "-test.count=1")
	// A race-enabled child would sleep a second at exit unless told otherwise.
	c.cmd.Env = append(os.Environ(), RoleEnv+"="+role, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	c.cmd.Env = append(c.cmd.Env, env...)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	stdin, err := c.cmd.StdinPipe()
	if err != nil {
		t.Fatalf("crashtest: %v", err)
	}
	c.stdin = stdin
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatalf("crashtest: %v", err)
	}
	c.cmd.ExtraFiles = []*os.File{w} // fd 3 in the child
	if err := c.cmd.Start(); err != nil {
		r.Close()
		w.Close()
		t.Fatalf("crashtest: starting role %s: %v", role, err)
	}
	w.Close() // the child holds the write end now: EOF comes when it exits
	go func() {
		defer close(c.marks)
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.marks <- sc.Text()
		}
	}()
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(c.cleanup)
	return c
}

// Pid returns the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Output returns what the child wrote on stdout and stderr so far.
func (c *Child) Output() string { return c.out.String() }

// Await waits until the child marks point and returns the mark's detail ("" if none).
// Marks of other points before it are passed over (and listed if Await fails). It fails
// the test, with the child's exit status, its marks and its output, when the child exits
// before marking point or does not mark it within two minutes (or before the test's
// deadline); in the timeout case it kills the child first.
func (c *Child) Await(point string) string {
	c.t.Helper()
	timeout := awaitTimeout
	if d, ok := c.t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			timeout = min(timeout, max(time.Until(dl)-5*time.Second, time.Second))
		}
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-c.marks:
			if !ok {
				<-c.done
				c.t.Fatalf("crashtest: child %s exited (%v) before it marked %q; marks %q; output:\n%s",
					c.role, c.err, point, c.seen, c.Output())
			}
			p, detail, _ := strings.Cut(line, " ")
			if p == point {
				return detail
			}
			c.seen = append(c.seen, line)
		case <-timer.C:
			c.kill()
			c.t.Fatalf("crashtest: child %s did not mark %q within %v; marks %q; output:\n%s",
				c.role, point, timeout, c.seen, c.Output())
		}
	}
}

// Kill SIGKILLs the child, reaps it, and returns the marks it made that Await did not
// consume (each "point" or "point detail"), in order. It fails the test, with the child's
// output, unless the child died of that SIGKILL: a child that had already exited on its
// own did not crash where the test meant it to.
func (c *Child) Kill() []string {
	c.t.Helper()
	select {
	case <-c.done:
		c.t.Fatalf("crashtest: child %s exited (%v) before it was killed; output:\n%s", c.role, c.err, c.Output())
	default:
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatalf("crashtest: SIGKILL child %s: %v", c.role, err)
	}
	_ = c.cmd.Process.Signal(syscall.SIGCONT) // a stopped child dies only once continued on some kernels
	var rest []string
	for line := range c.marks {
		rest = append(rest, line)
	}
	<-c.done
	var exit *exec.ExitError
	if !errors.As(c.err, &exit) {
		c.t.Fatalf("crashtest: child %s was not killed: %v; output:\n%s", c.role, c.err, c.Output())
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		c.t.Fatalf("crashtest: child %s ended by %v, not by SIGKILL; output:\n%s", c.role, c.err, c.Output())
	}
	return rest
}

// Stop SIGSTOPs the child and, on Linux, returns once the kernel reports it stopped (every
// thread of it); elsewhere it returns once the signal is sent. It fails the test if the
// child exited instead.
func (c *Child) Stop() {
	c.t.Helper()
	c.signalAndWait(syscall.SIGSTOP, true)
}

// Continue SIGCONTs a stopped child and, on Linux, returns once the kernel reports it
// running again. It fails the test if the child exited instead.
func (c *Child) Continue() {
	c.t.Helper()
	c.signalAndWait(syscall.SIGCONT, false)
}

// signalAndWait sends sig and waits for the child to be stopped (stopped) or continued.
func (c *Child) signalAndWait(sig syscall.Signal, stopped bool) {
	c.t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("crashtest: %v to child %s: %v; output:\n%s", sig, c.role, err, c.Output())
	}
	if err := waitState(c.Pid(), stopped); err != nil {
		c.t.Fatalf("crashtest: child %s did not take %v: %v; output:\n%s", c.role, sig, err, c.Output())
	}
}

// kill ends the child without checks (timeouts, cleanup).
func (c *Child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	_ = c.cmd.Process.Signal(syscall.SIGCONT)
	<-c.done
}

func (c *Child) cleanup() {
	select {
	case <-c.done:
	default:
		c.kill()
	}
	_ = c.stdin.Close()
	for range c.marks { // let the reader finish
	}
	if c.t.Failed() {
		c.t.Logf("crashtest: child %s (%v) wrote:\n%s", c.role, c.err, c.Output())
	}
}

// lockedBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
