package transport

import (
	"os"
	"testing"

	"github.com/toolfence/toolfence/internal/testkit"
)

// The test binary plays the upstreams of upstream_test.go, chosen by testkit.RoleEnv.
func TestMain(m *testing.M) {
	testkit.RunRole(upstreamRoles)
	os.Exit(m.Run())
}
