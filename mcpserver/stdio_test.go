package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpserver"
)

// In the role "serve" (testkit.RoleEnv) the test binary is an MCP server on stdin/stdout, as
// `toolfence serve --stdio` is: over the badger store and in the namespace that serveEnv
// names (JSON serveJob). The stdio tests start it as their server process instead of
// building cmd/toolfence.
const serveEnv = "TOOLFENCE_MCPSERVER_TEST_SERVE"

type serveJob struct {
	Store     string `json:"store"`
	Namespace string `json:"namespace"`
}

// runServer serves one MCP client on stdin/stdout until stdin ends or a signal arrives, and
// returns the exit code.
func runServer() int {
	var job serveJob
	if err := json.Unmarshal([]byte(os.Getenv(serveEnv)), &job); err != nil {
		fmt.Fprintf(os.Stderr, "stdio server: $%s: %v\n", serveEnv, err)
		return 3
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serveStdio(ctx, job); err != nil {
		fmt.Fprintln(os.Stderr, "stdio server:", err)
		return 1
	}
	return 0
}

func serveStdio(ctx context.Context, job serveJob) error {
	led, err := badger.Open(job.Store, badger.Options{})
	if err != nil {
		return err
	}
	defer led.Close()
	ic, err := interceptor.New(led, interceptor.Options{Namespace: job.Namespace, LeaseTTL: interceptor.DefaultLeaseTTL})
	if err != nil {
		return err
	}
	srv, err := mcpserver.New(ic, mcpserver.Options{
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	defer srv.Close()
	return srv.ServeStdio(ctx, job.Namespace, os.Stdin, os.Stdout)
}

// stdioServer returns the command line of a stdio MCP server over a badger store in dir:
// this test binary, with the environment entries that make it serve (see serveEnv).
func stdioServer(t *testing.T, dir, namespace string) (command string, args, env []string) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	job, err := json.Marshal(serveJob{Store: dir, Namespace: namespace})
	require.NoError(t, err)
	return exe, []string{"-test.run=^$"}, []string{testkit.WithRole("serve"), serveEnv + "=" + string(job)}
}

// dialStdio starts a stdio MCP server over a store in dir (see stdioServer) and connects an
// mcp-go client to it on the given protocol.
func dialStdio(t *testing.T, dir, namespace, version string) *client.Client {
	t.Helper()
	command, args, env := stdioServer(t, dir, namespace)
	tr := transport.NewStdio(command, env, args...)
	return start(t, client.NewClient(tr, client.WithProtocolVersion(version)), version)
}
