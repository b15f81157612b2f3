// Package proxyrun is the proxy process of the tests that run one: what `toolfence proxy
// --store DIR -- TESTBINARY` does, the upstream being the test binary in another role.
package proxyrun

import (
	"context"
	"os"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// Serve opens the badger store in dir, guards with ic and opts, starts this binary as the
// upstream in upstreamRole (testkit.RoleEnv) and relays this process's stdio to it until
// the host closes stdin. It returns the first error of those steps, or Serve's.
func Serve(dir string, ic interceptor.Options, opts mcpproxy.Options, upstreamRole string) error {
	l, err := badger.Open(dir, badger.Options{})
	if err != nil {
		return err
	}
	defer l.Close()
	in, err := interceptor.New(l, ic)
	if err != nil {
		return err
	}
	p, err := mcpproxy.New(in, opts)
	if err != nil {
		return err
	}
	if err := os.Setenv(testkit.RoleEnv, upstreamRole); err != nil {
		return err
	}
	up, err := transport.StartUpstream(context.Background(), []string{os.Args[0]}, os.Stderr)
	if err != nil {
		return err
	}
	defer up.Close()
	return p.Serve(context.Background(), transport.Stdio(os.Stdin, os.Stdout), up.Conn())
}
