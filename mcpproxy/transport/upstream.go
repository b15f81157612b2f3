package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Upstream is an upstream MCP server running as a stdio child in its own process group, so a
// signal meant for the host's process group does not reach it mid-call, and Close ends it
// with everything it started.
type Upstream struct {
	cmd  *exec.Cmd
	conn mcp.Connection
	once sync.Once
	done chan struct{}
	err  error
}

// StartUpstream starts argv (the command and its arguments) with its stdin and stdout as the
// MCP connection and its stderr on stderr (discarded when nil). It returns an error naming
// the command when it cannot be started.
func StartUpstream(ctx context.Context, argv []string, stderr io.Writer) (*Upstream, error) {
	if len(argv) == 0 {
		return nil, errors.New("mcpproxy: no upstream command: give it after --, e.g. toolfence proxy -- npx some-mcp-server")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("mcpproxy: upstream %q: %w", argv[0], err)
	}
	// Our own pipe, not cmd.StdoutPipe: Wait closes that one as soon as the child exits,
	// which lost the child's last messages and made a read fail with "file already closed".
	out, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("mcpproxy: upstream %q: %w", argv[0], err)
	}
	cmd.Stdout = w
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		_ = w.Close()
		_ = in.Close()
		return nil, fmt.Errorf("mcpproxy: starting upstream %q: %w", argv[0], err)
	}
	_ = w.Close() // the child holds its copy; EOF comes when it exits
	u := &Upstream{cmd: cmd, done: make(chan struct{})}
	go func() { u.err = cmd.Wait(); close(u.done) }()
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
		if u.conn != nil {
			_ = u.conn.Close()
		}
		select {
		case <-u.done:
		case <-time.After(2 * time.Second):
		}
		_ = syscall.Kill(-u.cmd.Process.Pid, syscall.SIGKILL)
		<-u.done
	})
	return nil
}
