package crashtest

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// si_code values of a SIGCHLD (see waitid(2)); x/sys/unix does not name them.
const (
	cldExited    = 1
	cldKilled    = 2
	cldDumped    = 3
	cldStopped   = 5
	cldContinued = 6
)

// waitState blocks until the kernel reports child pid stopped (stopped true) or continued,
// without reaping it (WNOWAIT), and returns an error if it exited instead.
func waitState(pid int, stopped bool) error {
	want, opt := cldStopped, unix.WSTOPPED
	if !stopped {
		want, opt = cldContinued, unix.WCONTINUED
	}
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, opt|unix.WEXITED|unix.WNOWAIT, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ECHILD):
			return errors.New("it has exited and been reaped")
		case err != nil:
			return err
		}
		switch info.Code {
		case int32(want):
			return nil
		case cldExited, cldKilled, cldDumped:
			return fmt.Errorf("it exited (si_code %d)", info.Code)
		}
		return fmt.Errorf("unexpected child state (si_code %d)", info.Code)
	}
}
