package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// RunWithBinaries is the TestMain of a package whose tests run binaries as a user would: it
// builds pkgs (import paths or directories of main packages) into a fresh temporary
// directory, hands the directory to set, runs the tests and removes the directory. It returns
// the exit code for os.Exit; a failed build prints the compiler's output and returns 1.
//
// The go command is the one on the PATH, which `go test` starts with its own GOROOT/bin. The
// binaries are built without -race, whatever the tests run with.
func RunWithBinaries(m *testing.M, set func(dir string), pkgs ...string) int {
	dir, err := os.MkdirTemp("", "toolfence-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	build := exec.Command("go", append([]string{"build", "-o", dir + string(os.PathSeparator)}, pkgs...)...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "building %v: %v\n", pkgs, err)
		return 1
	}
	set(dir)
	return m.Run()
}
