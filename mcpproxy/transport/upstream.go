package transport

import (
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
	cmd    *exec.Cmd
	conn   mcp.Connection
	errR   *os.File // the read end of the child's stderr; nil when it is discarded
	once   sync.Once
	copied chan struct{} // closed when the copy of the child's stderr has ended
	done   chan struct{}
	err    error
}

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
	u := &Upstream{cmd: cmd, errR: errR, copied: make(chan struct{}), done: make(chan struct{})}
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
	u.conn = newLineConn(out, in, func() error { return errors.Join(in.Close(), out.Close()) })
	return u, nil
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

// Close closes the upstream's stdin, gives it 2 s to exit, then kills its process group,
// and kills what is left of the group once it has exited (processes it started and left
// behind). It returns nil once the process has exited.
func (u *Upstream) Close() error {
	u.once.Do(func() {
		_ = u.conn.Close()
		select {
		case <-u.done:
		case <-time.After(2 * time.Second):
		}
		_ = syscall.Kill(-u.cmd.Process.Pid, syscall.SIGKILL)
		<-u.done
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
