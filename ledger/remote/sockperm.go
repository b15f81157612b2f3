package remote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
)

// ErrUntrustedSocket is wrapped by the error of a guest that will not use the owner's
// socket: it is not a socket, another user owns it, group or others can write it, or the
// process serving it runs as another user (checked on Linux). Nothing was sent to it.
var ErrUntrustedSocket = errors.New("remote: the store's socket is not this user's")

// untrustedError says why a socket is not trusted and what to do.
type untrustedError struct {
	path string
	why  string
}

func (e *untrustedError) Error() string {
	return fmt.Sprintf("remote: socket %s %s: another user may have put it there to answer for the store, so nothing was sent to it; "+
		"stop whatever serves it, remove it (rm %s), and make its directory yours alone (chown and chmod 0700 %s)",
		e.path, e.why, e.path, filepath.Dir(e.path))
}

func (e *untrustedError) Is(target error) bool { return target == ErrUntrustedSocket }

// userName returns "uid N (name)", or "uid N" when the name is unknown.
func userName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil && u.Username != "" {
		return "uid " + id + " (" + u.Username + ")"
	}
	return "uid " + id
}

// dialOwner connects to the owner's socket at path once it is sure the owner is this
// user: the socket file must pass checkSocketFile before the dial, and the peer must pass
// checkPeer after it (the file could be swapped in between; the peer's credentials cannot).
// A missing socket or a refused connection is the dial's own error (an owner starting or
// gone); a socket that fails a check is an *untrustedError.
func dialOwner(ctx context.Context, path string) (net.Conn, error) {
	if err := checkSocketFile(path); err != nil {
		return nil, err
	}
	addr, release, err := sockAddr(path)
	if err != nil {
		return nil, err
	}
	defer release()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", addr)
	if err != nil {
		return nil, err
	}
	if err := checkPeer(path, c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// ownerTransport returns the transport a guest reaches the owner's socket at path with:
// every connection comes from dialOwner.
func ownerTransport(path string) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) { return dialOwner(ctx, path) }
	t.Proxy = nil
	t.MaxIdleConnsPerHost = 128
	return t
}

// listenPrivate listens on a unix socket at path that only this user can ever connect to:
// it binds inside a new directory of mode 0700 (so no one else can reach the socket while
// its own mode is still what the umask left), makes the socket mode 0600, and renames it
// over path (replacing the socket of a dead owner; the caller holds the store, so no live
// owner serves there). It does not touch the process umask.
func listenPrivate(path string) (net.Listener, error) {
	priv, err := os.MkdirTemp(filepath.Dir(path), ".sock") // mode 0700
	if err != nil {
		return nil, err
	}
	defer os.Remove(priv)
	tmp := filepath.Join(priv, "s")
	addr, release, err := sockAddr(tmp)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", addr)
	release()
	if err != nil {
		return nil, err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		ln.Close()
		os.Remove(tmp)
		return nil, err
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	return ln, nil
}
