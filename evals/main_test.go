package evals

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// roleEnv makes the test binary act as a worker or the sink when it re-executes itself.
const roleEnv = testkit.RoleEnv

func TestMain(m *testing.M) {
	testkit.RunRole(map[string]func() int{
		"worker":   func() int { return WorkerMain(context.Background(), os.Args[1:], os.Stdout) },
		"sink":     func() int { return SinkMain(os.Args[1:], os.Stdout) },
		"payments": func() int { return PaymentsMain(os.Args[1:]) },
		"relay":    func() int { return RelayMain(os.Args[1:]) },
		"proxy":    func() int { return testProxyMain(os.Args[1:]) },
	})
	os.Exit(m.Run())
}

// testCommand re-executes the test binary in a role. The payments server's role is in its
// command line (through env(1)): the proxy or relay that starts it passes its own
// environment on.
func testCommand(role string, args ...string) *exec.Cmd {
	// A race-enabled child sleeps a second at exit unless told otherwise.
	gorace := "GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")
	if role == "payments" {
		env, err := exec.LookPath("env")
		if err != nil {
			panic(err)
		}
		return exec.Command(env, append([]string{roleEnv + "=" + role, gorace, os.Args[0]}, args...)...)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), roleEnv+"="+role, gorace)
	return cmd
}

// testProxyMain is what `toolfence proxy --store DIR --server-id ID --config FILE --lease D
// -- CMD...` does (the CLI's eval runs the real command; this test binary cannot).
func testProxyMain(args []string) int {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	store := fs.String("store", "", "")
	serverID := fs.String("server-id", "", "")
	config := fs.String("config", "", "")
	lease := fs.Duration("lease", 0, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "proxy:", err); return 1 }
	l, err := badger.Open(*store, badger.Options{})
	if err != nil {
		return fail(err)
	}
	defer l.Close()
	ic, err := interceptor.New(l, interceptor.Options{LeaseTTL: *lease})
	if err != nil {
		return fail(err)
	}
	pol, err := mcpproxy.LoadPolicy(*config)
	if err != nil {
		return fail(err)
	}
	p, err := mcpproxy.New(ic, mcpproxy.Options{ServerID: *serverID, Policy: pol})
	if err != nil {
		return fail(err)
	}
	up, err := transport.StartUpstream(context.Background(), fs.Args(), os.Stderr)
	if err != nil {
		return fail(err)
	}
	defer up.Close()
	if err := p.Serve(context.Background(), transport.Stdio(os.Stdin, os.Stdout), up.Conn()); err != nil {
		return fail(err)
	}
	return 0
}
