package testkit

import (
	"os"
	"os/user"
	"strconv"
	"testing"
)

// NeedRoot skips a test that needs root (to mount, or to act as another user), saying why;
// under CI=true it fails instead, since CI runs the tests as root.
func NeedRoot(tb testing.TB, why string) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		tb.Fatalf("this test needs root (%s); CI runs it as root", why)
	}
	tb.Skipf("needs root (%s)", why)
}

// Nobody returns the uid and gid of user nobody, the other user of the permission tests,
// after NeedRoot(tb, why). It fails the test when the user does not exist.
func Nobody(tb testing.TB, why string) (uid, gid int) {
	tb.Helper()
	NeedRoot(tb, why)
	u, err := user.Lookup("nobody")
	if err != nil {
		tb.Fatalf("user nobody: %v", err)
	}
	if uid, err = strconv.Atoi(u.Uid); err == nil {
		gid, err = strconv.Atoi(u.Gid)
	}
	if err != nil {
		tb.Fatalf("user nobody: %v", err)
	}
	return uid, gid
}
