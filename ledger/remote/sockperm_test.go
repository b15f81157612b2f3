//go:build linux

package remote_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/remote"
)

// The tests here act as two users: this process (root) and user nobody, run as a child
// process of the test binary (runRole). Run as another user than root they cannot start
// the nobody child: they skip, except under CI=true, where they fail (CI runs them as root).

// nobodyUser returns the credential of user nobody.
func nobodyUser(t *testing.T) *syscall.Credential {
	t.Helper()
	uid, gid := testkit.Nobody(t, "to run a process as user nobody")
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// child is the test binary running a role of runRole.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// startRole starts the test binary in role with dir, as cred (nil: as this process).
// nobody cannot read the test binary where go test builds it, so a child of another user
// runs a copy in a directory it can traverse. The child is killed at cleanup.
func startRole(t *testing.T, cred *syscall.Credential, role, dir string) *child {
	t.Helper()
	bin := os.Args[0]
	if cred != nil {
		binDir, err := os.MkdirTemp("", "tfbin")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(binDir) })
		require.NoError(t, os.Chmod(binDir, 0o755))
		data, err := os.ReadFile(bin)
		require.NoError(t, err)
		bin = filepath.Join(binDir, "remote.test")
		require.NoError(t, os.WriteFile(bin, data, 0o755))
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), roleEnv+"="+role, "TOOLFENCE_REMOTE_TEST_DIR="+dir, "GORACE=atexit_sleep_ms=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &child{cmd: cmd, stdin: stdin, out: bufio.NewScanner(out)}
}

// line returns the child's next line of output ("" at its end).
func (c *child) line() string {
	if c.out.Scan() {
		return c.out.Text()
	}
	return ""
}

// runRole runs a child role (see TestMain) and exits:
//   - squatter: serves HTTP on $DIR/toolfence.sock, printing "ready", then "conn" for
//     every connection and "request" for every request, until killed;
//   - prober: dials every socket it finds in $DIR (and one level below) until its stdin
//     closes, then prints "connected N" (connections that succeeded) and exits;
//   - churn: with umask 000, becomes the owner of a store in $DIR and closes it 400
//     times, then prints "done".
func runRole(role string) {
	dir := os.Getenv("TOOLFENCE_REMOTE_TEST_DIR")
	switch role {
	case "owner":
		runOwner()
	case "squatter":
		ln, err := net.Listen("unix", filepath.Join(dir, "toolfence.sock"))
		if err != nil {
			fmt.Println("listen:", err)
			os.Exit(3)
		}
		fmt.Println("ready")
		srv := &http.Server{
			ReadHeaderTimeout: 10 * time.Second,
			ConnState: func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					fmt.Println("conn")
				}
			},
			Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Println("request")
				http.Error(w, "squatted", http.StatusTeapot)
			}),
		}
		_ = srv.Serve(ln)
		os.Exit(3)
	case "prober":
		stop := make(chan struct{})
		go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
		connected := 0
		for i := 0; i < 10_000_000; i++ { // bounded; ends when the parent closes stdin
			select {
			case <-stop:
				fmt.Println("connected", connected)
				os.Exit(0)
			default:
			}
			for _, p := range socketsIn(dir) {
				if c, err := net.Dial("unix", p); err == nil {
					connected++
					c.Close()
				}
			}
		}
		fmt.Println("connected", connected, "(gave up waiting for the end)")
		os.Exit(0)
	case "churn":
		syscall.Umask(0) // the worst case, in this child only
		for range 400 {
			s, err := remote.OpenShared(context.Background(), remote.SharedOptions{
				Socket: filepath.Join(dir, "toolfence.sock"),
				Open:   func() (ledger.Ledger, error) { return nopLedger{}, nil },
				Locked: func(error) bool { return false },
			})
			if err != nil || !s.Owner() {
				fmt.Println("not owner:", err)
				os.Exit(3)
			}
			_ = s.Close()
		}
		fmt.Println("done")
		os.Exit(0)
	}
	fmt.Println("unknown role", role)
	os.Exit(3)
}

// socketsIn lists the unix sockets in dir and in its subdirectories.
func socketsIn(dir string) []string {
	var out []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		switch {
		case e.Type() == os.ModeSocket:
			out = append(out, p)
		case e.IsDir():
			sub, _ := os.ReadDir(p)
			for _, s := range sub {
				if s.Type() == os.ModeSocket {
					out = append(out, filepath.Join(p, s.Name()))
				}
			}
		}
	}
	return out
}

// nopLedger is an owner's store that is never called (nobody dials the churn's socket
// successfully); Close works.
type nopLedger struct{ ledger.Ledger }

func (nopLedger) Close() error { return nil }

// heldOpts is a shared store in dir that another process holds: a guest goes to the socket.
func heldOpts(dir string) remote.SharedOptions {
	locked := errors.New("held by another process")
	return remote.SharedOptions{
		Socket: filepath.Join(dir, "toolfence.sock"),
		Open:   func() (ledger.Ledger, error) { return nil, locked },
		Locked: func(err error) bool { return errors.Is(err, locked) },
		Wait:   time.Second,
	}
}

// TestGuestRefusesSocketOfOtherUser: nobody plants the owner's socket in a directory it
// can write and serves on it; a guest refuses it before dialling (no connection reaches
// the squatter), with an error naming the socket, its owner and what to do.
func TestGuestRefusesSocketOfOtherUser(t *testing.T) {
	cred := nobodyUser(t)
	dir := shortDir(t)
	require.NoError(t, os.Chmod(dir, 0o777))
	sq := startRole(t, cred, "squatter", dir)
	require.Equal(t, "ready", sq.line())

	_, err := remote.OpenShared(t.Context(), heldOpts(dir))
	require.ErrorIs(t, err, remote.ErrUntrustedSocket)
	sock := filepath.Join(dir, "toolfence.sock")
	require.ErrorContains(t, err, "socket "+sock+" is owned by uid "+strconv.Itoa(int(cred.Uid))+" (nobody), not by you (uid 0")
	require.ErrorContains(t, err, "nothing was sent to it")
	require.ErrorContains(t, err, "chmod 0700 "+dir)

	require.NoError(t, sq.cmd.Process.Kill())
	_ = sq.cmd.Wait()
	for l := sq.line(); l != ""; l = sq.line() {
		require.NotEqual(t, "conn", l, "the guest connected to the squatter's socket")
	}
}

// TestGuestRefusesPeerOfOtherUser: the socket file is ours (root chowned nobody's socket
// to itself) but the process serving it runs as nobody: the guest connects, reads the
// peer's credentials (SO_PEERCRED) and hangs up before sending a request.
func TestGuestRefusesPeerOfOtherUser(t *testing.T) {
	cred := nobodyUser(t)
	dir := shortDir(t)
	require.NoError(t, os.Chmod(dir, 0o777))
	sq := startRole(t, cred, "squatter", dir)
	require.Equal(t, "ready", sq.line())
	sock := filepath.Join(dir, "toolfence.sock")
	require.NoError(t, os.Chown(sock, 0, 0))
	require.NoError(t, os.Chmod(sock, 0o600))

	_, err := remote.OpenShared(t.Context(), heldOpts(dir))
	require.ErrorIs(t, err, remote.ErrUntrustedSocket)
	require.ErrorContains(t, err, "is served by process")
	require.ErrorContains(t, err, "of uid "+strconv.Itoa(int(cred.Uid))+" (nobody), not by you")

	require.NoError(t, sq.cmd.Process.Kill())
	_ = sq.cmd.Wait()
	for l := sq.line(); l != ""; l = sq.line() {
		require.NotEqual(t, "request", l, "the guest sent a request to another user's process")
	}
}

// TestGuestRefusesWritableSocket: a socket of ours that others can write is refused too.
func TestGuestRefusesWritableSocket(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "toolfence.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer ln.Close()
	require.NoError(t, os.Chmod(sock, 0o666))
	_, err = remote.OpenShared(t.Context(), heldOpts(dir))
	require.ErrorIs(t, err, remote.ErrUntrustedSocket)
	require.ErrorContains(t, err, "has mode 0666: group or other users can write it")
}

// TestOwnerSocketNeverConnectableByOthers: an owner started 400 times under umask 000 in a
// directory others can traverse, while nobody dials every socket it can see there: not one
// connection succeeds (the socket is bound in a private directory and made 0600 before it
// is moved into place).
func TestOwnerSocketNeverConnectableByOthers(t *testing.T) {
	cred := nobodyUser(t)
	dir := shortDir(t)
	require.NoError(t, os.Chmod(dir, 0o755))
	prober := startRole(t, cred, "prober", dir)
	churn := startRole(t, nil, "churn", dir)
	require.Equal(t, "done", churn.line())
	require.NoError(t, churn.cmd.Wait())
	require.NoError(t, prober.stdin.Close())
	got := prober.line()
	require.Equal(t, "connected 0", got, "another user connected to the owner's socket")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		require.False(t, strings.HasPrefix(e.Name(), ".sock"), "private bind directory %s left behind", e.Name())
	}
}
