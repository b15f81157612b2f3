package evals

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// roleEnv makes the test binary act as a worker or the sink when it re-executes itself.
const roleEnv = "TOOLFENCE_EVAL_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "worker":
		os.Exit(WorkerMain(context.Background(), os.Args[1:], os.Stdout))
	case "sink":
		os.Exit(SinkMain(os.Args[1:], os.Stdout))
	}
	os.Exit(m.Run())
}

// testCommand re-executes the test binary in a role.
func testCommand(role string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	// A race-enabled child sleeps a second at exit unless told otherwise.
	cmd.Env = append(os.Environ(), roleEnv+"="+role, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return cmd
}
