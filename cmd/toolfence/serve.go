package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpserver"
)

func init() { register(newServeCmd) }

// tokenEnv names the environment variable holding one bearer token for --http.
const tokenEnv = "TOOLFENCE_TOKEN"

type serveFlags struct {
	stdio     bool
	http      string
	tokenFile string
	stateless bool
	lease     time.Duration
	maxArgs   int
	metrics   string
}

func newServeCmd(a *app) *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve (--stdio | --http ADDR)",
		Short: "Serve the ledger over MCP: tools for successor agents and the guard protocol for any MCP agent",
		Long: `Serve the ledger as an MCP server, over stdio (--stdio, for an MCP host that starts
toolfence as a child process) or over streamable HTTP at /mcp (--http 127.0.0.1:7777).

Tools: list_pending, inspect_residual, begin_call, commit_call, renew_lease,
resolve_residual and reconcile. Resources: toolfence://pending and
toolfence://residuals/{key}, with change notifications. Prompt: reconcile_task.

Over HTTP every request needs "Authorization: Bearer TOKEN". Tokens come from --token-file
(lines "TOKEN NAMESPACE", or just "TOKEN" for --namespace; or JSON {"TOKEN": "NAMESPACE"};
the file must not be readable by other users) or from $` + tokenEnv + ` (one token, for
--namespace). A token is at least ` + strconv.Itoa(mcpserver.MinTokenLen) + ` bytes long and holds no whitespace
(make one with: openssl rand -hex 32). Each token sees only its namespace. Without any
token the server refuses to listen on anything but a loopback address.

While serve holds an embedded (badger) store, other toolfence commands cannot open it:
use their --server URL flag to act through the server instead.

Telemetry (nothing is exported by default): --metrics 127.0.0.1:9464 serves Prometheus
metrics at http://127.0.0.1:9464/metrics, without authentication (keep it on loopback or a
private network); with OTEL_EXPORTER_OTLP_ENDPOINT set, traces and metrics are exported over
OTLP/HTTP. An MCP request's span joins the agent's trace when the request carries W3C
traceparent/tracestate in params._meta. Reference: docs/observability.md.

Example:
  toolfence serve --stdio --store ./.toolfence
  toolfence serve --http 127.0.0.1:7777 --token-file ./tokens --metrics 127.0.0.1:9464`,
		Args: args(),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.serve(cmd, f) },
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.stdio, "stdio", false, "serve one MCP client on stdin/stdout")
	fl.StringVar(&f.http, "http", "", "serve streamable HTTP at ADDR (host:port), endpoint /mcp")
	fl.StringVar(&f.tokenFile, "token-file", "", fmt.Sprintf("bearer tokens for --http (\"TOKEN [NAMESPACE]\" lines or JSON; each token at least %d bytes)", mcpserver.MinTokenLen))
	fl.BoolVar(&f.stateless, "stateless", false, "serve HTTP clients of protocol versions up to 2025-11-25 without sessions")
	fl.DurationVar(&f.lease, "lease", mcpserver.DefaultLease, "lease of a begin_call without lease_ms")
	fl.IntVar(&f.maxArgs, "max-args", interceptor.DefaultMaxArgs, "largest begin_call args accepted, in bytes")
	fl.StringVar(&f.metrics, "metrics", "", metricsFlagHelp)
	addLogFlags(fl, &a.log)
	return cmd
}

func (a *app) serve(cmd *cobra.Command, f serveFlags) error {
	if f.stdio == (f.http != "") {
		return usagef("give exactly one of --stdio or --http ADDR")
	}
	if f.stdio && f.tokenFile != "" {
		return usagef("--token-file applies to --http only")
	}
	if f.lease <= 0 || f.maxArgs <= 0 {
		return usagef("--lease and --max-args must be positive")
	}
	log, err := a.log.logger(a.stderr)
	if err != nil {
		return usagef("%v", err)
	}
	opts := mcpserver.Options{HTTPStateless: f.stateless, Version: buildVersion(), Logger: log}
	if f.http != "" {
		tokens, err := loadServeTokens(f.tokenFile, a.namespace)
		if err != nil {
			return usagef("%v", err)
		}
		if err := mcpserver.CheckBind(f.http, tokens.Len()); err != nil {
			return usagef("%v", err)
		}
		opts.Tokens = tokens
	}
	ctx := cmd.Context()
	l, err := a.open(ctx, false)
	if err != nil {
		return err
	}
	defer l.Close()
	tel, err := startTelemetry(ctx, f.metrics, l, log)
	if err != nil {
		return err
	}
	defer func() { _ = tel.Shutdown(context.WithoutCancel(ctx)) }()
	metricsServing(a.stderr, tel)
	ic, err := interceptor.New(l, interceptor.Options{Namespace: a.namespace, LeaseTTL: f.lease, MaxArgs: f.maxArgs, Logger: log})
	if err != nil {
		return usagef("%v", err)
	}
	srv, err := mcpserver.New(ic, opts)
	if err != nil {
		return usagef("%v", err)
	}
	defer srv.Close()
	if f.stdio {
		return srv.ServeStdio(ctx, a.namespace, cmd.InOrStdin(), a.stdout)
	}
	return srv.ListenAndServe(ctx, f.http, func(addr net.Addr) {
		serving(a.stderr, addr, opts.Tokens)
	})
}

// loadServeTokens reads --token-file, or else $TOOLFENCE_TOKEN (one token for namespace).
func loadServeTokens(file, namespace string) (mcpserver.Tokens, error) {
	if file != "" {
		return mcpserver.LoadTokens(file, namespace)
	}
	var t mcpserver.Tokens
	if tok := strings.TrimSpace(os.Getenv(tokenEnv)); tok != "" {
		if err := t.Add(tok, namespace); err != nil {
			return mcpserver.Tokens{}, fmt.Errorf("$%s: %w", tokenEnv, err)
		}
	}
	return t, nil
}

func serving(w io.Writer, addr net.Addr, tokens mcpserver.Tokens) {
	auth := fmt.Sprintf("%d bearer token(s)", tokens.Len())
	if tokens.Len() == 0 {
		auth = "no bearer token: loopback only, unauthenticated"
	}
	fmt.Fprintf(w, "toolfence: serving MCP at http://%s%s (%s)\n", addr, mcpserver.Path, auth)
}
