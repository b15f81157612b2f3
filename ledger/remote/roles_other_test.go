//go:build !linux

package remote_test

import (
	"fmt"
	"os"
)

// runRole runs a child role (see TestMain); off Linux only the owner of the SIGKILL tests.
func runRole(role string) {
	if role == "owner" {
		runOwner()
	}
	fmt.Println("unknown role", role)
	os.Exit(3)
}
