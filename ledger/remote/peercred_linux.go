package remote

import (
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// checkPeer returns an *untrustedError unless the process at the other end of c (a unix
// socket connection) runs as this process's effective user (SO_PEERCRED).
func checkPeer(path string, c net.Conn) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if credErr != nil {
		return fmt.Errorf("remote: reading the credentials of the process serving %s: %w", path, credErr)
	}
	if euid := uint32(os.Geteuid()); cred.Uid != euid {
		return &untrustedError{path: path, why: fmt.Sprintf("is served by process %d of %s, not by you (%s)", cred.Pid, userName(cred.Uid), userName(euid))}
	}
	return nil
}
