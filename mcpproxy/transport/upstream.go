package transport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Upstream is an upstream MCP server running as a stdio child in its own process group, so a
// signal meant for the host's process group does not reach it mid-call, and Close ends it
// with everything it started. On Linux the child also dies with the proxy (a parent-death
// signal), so a proxy killed outright leaves no server behind.
type Upstream struct {
	// Stop bounds each step of Close; set it before Close.
	Stop StopGrace

	cmd     *exec.Cmd
	conn    mcp.Connection
	in      *os.File // the write end of the child's stdin
	out     *os.File // the read end of the child's stdout
	errR    *os.File // the read end of the child's stderr; nil when it is discarded
	once    sync.Once
	drain   sync.Once
	drained chan struct{} // closed when the drain of out has ended
	copied  chan struct{} // closed when the copy of the child's stderr has ended
	done    chan struct{}
	err     error
}

// StopGrace is how long Close waits for the child at each step of the MCP stdio shutdown.
type StopGrace struct {
	// Exit is how long the child has to exit once its stdin is closed, before SIGTERM.
	// Defaults to 2 s.
	Exit time.Duration
	// Term is how long the child has to exit after SIGTERM, before SIGKILL. Defaults to 2 s.
	Term time.Duration
}

// DefaultStopGrace is each step's wait of Close when Upstream.Stop leaves it zero.
const DefaultStopGrace = 2 * time.Second

// stderrGrace is how long Close waits, once the process group is gone, for the last of the
// child's stderr to be copied (longer only if something outside the group still holds it),
// and then for the copy to end.
const stderrGrace = time.Second

// StartUpstream starts argv (the command and its arguments) with its stdin and stdout as the
// MCP connection and its stderr copied to stderr (discarded when nil). The child's stderr is
// a pipe of this process's, never stderr's own file, so that the host's end of the proxy's
// stderr closes when the proxy ends, whatever the child does. It returns an error naming the
// command when it cannot be started.
func StartUpstream(ctx context.Context, argv []string, stderr io.Writer) (*Upstream, error) {
	if len(argv) == 0 {
		return nil, errors.New("mcpproxy: no upstream command: give it after --, e.g. toolfence proxy -- npx some-mcp-server")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = upstreamAttr()
	// Our own pipes, not cmd.StdinPipe and StdoutPipe: Wait closes those as soon as the
	// child exits, which lost the child's last messages and made a read or a write fail
	// with "file already closed" instead of EOF or EPIPE.
	var pipes []*os.File // both ends of each pipe, closed when the child cannot start
	fail := func(err error) (*Upstream, error) {
		for _, f := range pipes {
			_ = f.Close()
		}
		return nil, err
	}
	inR, in, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("mcpproxy: upstream %q: %w", argv[0], err)
	}
	pipes = append(pipes, inR, in)
	cmd.Stdin = inR
	out, w, err := os.Pipe()
	if err != nil {
		return fail(fmt.Errorf("mcpproxy: upstream %q: %w", argv[0], err))
	}
	pipes = append(pipes, out, w)
	cmd.Stdout = w
	var errR *os.File
	if stderr != nil {
		var errW *os.File
		if errR, errW, err = os.Pipe(); err != nil {
			return fail(fmt.Errorf("mcpproxy: upstream %q: %w", argv[0], err))
		}
		pipes = append(pipes, errR, errW)
		cmd.Stderr = errW
	}
	u := &Upstream{cmd: cmd, in: in, out: out, errR: errR, drained: make(chan struct{}), copied: make(chan struct{}), done: make(chan struct{})}
	// The parent-death signal (Linux) fires when the thread that started the child ends, not
	// the process; the runtime ends a thread when a goroutine locked to it exits. So the
	// child is started and waited for on a goroutine locked to its thread for the child's
	// whole life: no other goroutine can run there, lock it and end it.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		u.err = cmd.Wait()
		close(u.done)
	}()
	if err := <-started; err != nil {
		return fail(fmt.Errorf("mcpproxy: starting upstream %q: %w", argv[0], err))
	}
	// The child holds its copies; EOF comes when it (and what it started) exits.
	_ = inR.Close()
	_ = w.Close()
	if errR != nil {
		_ = cmd.Stderr.(*os.File).Close()
		go func() { _, _ = io.Copy(stderr, errR); close(u.copied) }()
	} else {
		close(u.copied)
	}
	u.conn = newLineConn(out, in, u.closeInput)
	return u, nil
}

// closeInput is the connection's closer: it closes the child's stdin, the MCP signal to
// exit, ends a Read pending on the connection (a read deadline; the pipe's Reads take turns,
// so the drain's first Read comes after it) and reads the child's stdout to its end from
// then on, so that what the child writes while it finishes does not fail with EPIPE.
func (u *Upstream) closeInput() error {
	err := u.in.Close()
	_ = u.out.SetReadDeadline(time.Unix(1, 0))
	u.drain.Do(func() {
		go func() {
			defer close(u.drained)
			buf := make([]byte, 32<<10)
			for {
				_, err := u.out.Read(buf)
				switch {
				case err == nil:
				case errors.Is(err, os.ErrDeadlineExceeded):
					// The deadline that ended the connection's Read (or its context's): read on.
					_ = u.out.SetReadDeadline(time.Time{})
				default:
					return // EOF, or Close closed the pipe
				}
			}
		}()
	})
	return err
}

// Exit waits up to d for the upstream's process to end and returns how it ended ("exit
// status 1", "signal: killed"); ok is false while it still runs.
func (u *Upstream) Exit(d time.Duration) (state string, ok bool) {
	select {
	case <-u.done:
	case <-time.After(d):
		return "", false
	}
	if u.cmd.ProcessState != nil {
		return u.cmd.ProcessState.String(), true
	}
	return fmt.Sprint(u.err), true
}

// Conn returns the connection to the upstream server.
func (u *Upstream) Conn() mcp.Connection { return u.conn }

// Pid returns the upstream's process id (also its process group id).
func (u *Upstream) Pid() int { return u.cmd.Process.Pid }

// Close ends the upstream as the MCP stdio transport prescribes: it closes the child's
// stdin (reading its stdout to the end meanwhile), gives it Stop.Exit to exit, then sends its
// process group SIGTERM and gives it Stop.Term, then kills the group; once the child has
// exited it kills what is left of the group (processes it started and left behind). It
// returns nil once the process has exited.
func (u *Upstream) Close() error {
	u.once.Do(func() {
		_ = u.conn.Close() // calls closeInput
		pgid := u.cmd.Process.Pid
		select {
		case <-u.done:
		case <-time.After(cmp.Or(u.Stop.Exit, DefaultStopGrace)):
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			select {
			case <-u.done:
			case <-time.After(cmp.Or(u.Stop.Term, DefaultStopGrace)):
			}
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-u.done
		// The group is gone; stop reading what something outside it may still hold open.
		_ = u.out.Close()
		<-u.drained
		if u.errR != nil {
			select {
			case <-u.copied:
			case <-time.After(stderrGrace):
			}
			_ = u.errR.Close()
			select {
			case <-u.copied:
			case <-time.After(stderrGrace):
				// The copy is stuck writing to stderr (nobody reads it); leave it.
			}
		}
	})
	return nil
}
