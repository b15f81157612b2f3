package testkit

import (
	"fmt"
	"maps"
	"os"
	"slices"
)

// RoleEnv names the variable that makes a test binary, re-executed by its own package's
// tests, play a role (a worker, a sink, a server) instead of running the tests. Every package
// uses this one name; the roles are its own. (A crash child of crashtest has its own
// variable, crashtest.RoleEnv: it runs a test, not a role.)
const RoleEnv = "TOOLFENCE_TEST_ROLE"

// Role returns the role this test binary was started in, or "" in a normal test run.
func Role() string { return os.Getenv(RoleEnv) }

// WithRole returns the environment entry that starts a re-executed test binary in role.
func WithRole(role string) string { return RoleEnv + "=" + role }

// RunRole is the first call of a TestMain whose tests re-execute the test binary: in a
// normal test run it returns at once; in a child it runs the role named by RoleEnv and exits
// with its status. An unknown role exits with status 2, naming the roles the package knows.
func RunRole(roles map[string]func() int) {
	role := Role()
	if role == "" {
		return
	}
	fn, ok := roles[role]
	if !ok {
		fmt.Fprintf(os.Stderr, "testkit: unknown role %q (this package knows %q)\n", role, slices.Sorted(maps.Keys(roles)))
		os.Exit(2)
	}
	os.Exit(fn())
}

// RoleFunc adapts a role that returns an error: it prints "name: error" on stderr and
// returns 1 when fn fails, 0 otherwise.
func RoleFunc(name string, fn func() error) func() int {
	return func() int {
		if err := fn(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			return 1
		}
		return 0
	}
}
