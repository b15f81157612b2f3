package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/httpserve"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/ledger/remote"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
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
	minFree   int
	net       netFlags
	// upstreamIdempotent: operations whose /ledger/v1 reserves may re-dispatch over an
	// unknown outcome.
	upstreamIdempotent []string
}

// netFlags are the limits of serve's network surface (docs/limits.md lists them all).
type netFlags struct {
	maxConns      int
	maxPerPeer    int
	idleTimeout   time.Duration
	readTimeout   time.Duration
	headerTimeout time.Duration
	sessionIdle   time.Duration
	maxSessions   int
	maxDepth      int
	maxValues     int
	maxInFlight   int
	maxTotal      int
	pageSize      int
	// serve only: watch streams of /ledger/v1/ per token and in all.
	maxWatches, maxWatchesTotal int
}

// addShared adds the limits of the HTTP surface that serve --http and proxy --http share:
// connections, timeouts, sessions, the shape of a request's JSON and requests in progress.
func (n *netFlags) addShared(fl *pflag.FlagSet) {
	fl.IntVar(&n.maxConns, "max-conns", httpserve.DefaultMaxConns, "--http: connections held open at once (more wait to be accepted)")
	fl.IntVar(&n.maxPerPeer, "max-conns-per-peer", 0, "--http: connections one peer address holds at once, more are closed (0: the smaller of 256 and --max-conns)")
	fl.DurationVar(&n.idleTimeout, "idle-timeout", httpserve.DefaultIdleTimeout, "--http: close a keep-alive connection idle this long")
	fl.DurationVar(&n.readTimeout, "read-timeout", httpserve.DefaultReadTimeout, "--http: time to read a request, headers and body (never cuts notification streams)")
	fl.DurationVar(&n.headerTimeout, "header-timeout", httpserve.DefaultReadHeaderTimeout, "--http: time to read a request's headers")
	fl.DurationVar(&n.sessionIdle, "session-idle", mcpwire.DefaultSessionIdle, "--http: end a session (for proxy: with its upstream session) without requests for this long")
	fl.IntVar(&n.maxSessions, "max-sessions", mcpwire.DefaultMaxSessions, "--http: sessions one token holds at once (the least recently used idle one ends)")
	fl.IntVar(&n.maxDepth, "max-depth", mcpwire.DefaultMaxDepth, "--http: deepest JSON nesting of a request")
	fl.IntVar(&n.maxValues, "max-values", mcpwire.DefaultMaxValues, "--http: most objects, arrays and elements in a request's JSON")
	fl.IntVar(&n.maxInFlight, "max-inflight", mcpwire.DefaultMaxInFlight, "--http: requests one token has in progress at once (more get 429)")
	fl.IntVar(&n.maxTotal, "max-inflight-total", mcpwire.DefaultMaxInFlightTotal, "--http: requests in progress at once over all tokens (more get 429)")
}

// add adds serve's limits: the shared ones, and the size of its pages.
func (n *netFlags) add(fl *pflag.FlagSet) {
	n.addShared(fl)
	fl.IntVar(&n.pageSize, "page-size", mcpserver.DefaultPageSize, "entries per answer of resources/list, toolfence://pending and reconcile (each says when more remain)")
	fl.IntVar(&n.maxWatches, "max-watches", defaultMaxWatches, "--http: /ledger/v1/ watch streams one token holds open (more get 429)")
	fl.IntVar(&n.maxWatchesTotal, "max-watches-total", defaultMaxWatchesTotal, "--http: /ledger/v1/ watch streams open over all tokens; below --max-conns (more get 429)")
}

// The defaults of --max-watches and --max-watches-total: well below the connection cap, so
// that streams never take every connection.
const (
	defaultMaxWatches      = 8
	defaultMaxWatchesTotal = 64
)

// ledgerLimits are the bounds of serve's /ledger/v1/: the in-flight caps of /mcp (counted
// apart) and the watch caps. Valid only after apply.
func (n netFlags) ledgerLimits() remote.HandlerOptions {
	return remote.HandlerOptions{
		MaxInFlight: n.maxInFlight, MaxInFlightTotal: n.maxTotal,
		MaxWatches: n.maxWatches, MaxWatchesTotal: n.maxWatchesTotal,
	}
}

// apply copies the limits into opts, refusing values that are not positive.
func (n netFlags) apply(opts *mcpserver.Options) error {
	for name, v := range map[string]int64{
		"--max-conns": int64(n.maxConns), "--idle-timeout": int64(n.idleTimeout), "--read-timeout": int64(n.readTimeout),
		"--header-timeout": int64(n.headerTimeout), "--session-idle": int64(n.sessionIdle), "--max-sessions": int64(n.maxSessions),
		"--max-depth": int64(n.maxDepth), "--max-values": int64(n.maxValues), "--max-inflight": int64(n.maxInFlight),
		"--max-inflight-total": int64(n.maxTotal), "--page-size": int64(n.pageSize),
		"--max-watches": int64(n.maxWatches), "--max-watches-total": int64(n.maxWatchesTotal),
	} {
		if v <= 0 {
			return usagef("%s must be positive", name)
		}
	}
	if n.maxWatchesTotal >= n.maxConns {
		return usagef("--max-watches-total %d must be below --max-conns %d, or watch streams can take every connection", n.maxWatchesTotal, n.maxConns)
	}
	opts.MaxDepth, opts.MaxValues, opts.MaxInFlight, opts.MaxInFlightTotal = n.maxDepth, n.maxValues, n.maxInFlight, n.maxTotal
	if n.pageSize > ledger.MaxListLimit {
		return usagef("--page-size %d exceeds %d", n.pageSize, ledger.MaxListLimit)
	}
	opts.PageSize = n.pageSize
	opts.MaxConns, opts.IdleTimeout, opts.ReadTimeout, opts.ReadHeaderTimeout = n.maxConns, n.idleTimeout, n.readTimeout, n.headerTimeout
	opts.SessionIdle, opts.MaxSessions = n.sessionIdle, n.maxSessions
	return n.applyPerPeer(opts)
}

// applyPerPeer copies --max-conns-per-peer into opts, refusing a negative value or one over
// --max-conns.
func (n netFlags) applyPerPeer(opts *mcpserver.Options) error {
	if n.maxPerPeer < 0 || n.maxPerPeer > n.maxConns {
		return usagef("--max-conns-per-peer %d: want 0 (the default) to --max-conns %d", n.maxPerPeer, n.maxConns)
	}
	opts.MaxConnsPerPeer = n.maxPerPeer
	return nil
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
--namespace). A token is at least ` + strconv.Itoa(mcpwire.MinTokenLen) + ` bytes long and holds no whitespace
(make one with: openssl rand -hex 32). Each token sees only its namespace. Without any
token the server refuses to listen on anything but a loopback address.

Over HTTP the server holds at most --max-conns connections (--max-conns-per-peer of one
address; more are closed at once, so one peer cannot take them all), closes keep-alive connections
idle for --idle-timeout and requests slower than --read-timeout / --header-timeout; nothing
bounds writing, so notification streams stay open. A session without requests for
--session-idle ends (its client gets 404 and initializes anew), and a token holds at most
--max-sessions. A request nesting deeper than --max-depth or holding more than --max-values
values is refused before it is decoded; past --max-inflight requests of one token (or
--max-inflight-total of all) answers are 429 with Retry-After; /ledger/v1/ counts its own
steps under the same caps and holds at most --max-watches watch streams per token
(--max-watches-total in all). docs/limits.md lists every limit.

On the embedded store, new reservations are refused (unavailable) while its filesystem has
less than --min-free-mib free, so a full disk never stops serve; calls in flight commit.

An embedded (badger) store is shared: the first toolfence process to open it serves it to
the others on DIR/toolfence.sock, and a process that finds it held goes through that socket
(taking the store over when its holder exits). Over --http, the ledger itself is served at
/ledger/v1/ to the tokens granted it: a line "TOKEN NAMESPACE ledger" in --token-file (an MCP
agent's token gets 403 there). Other machines' toolfence processes use it with --store
http://HOST:PORT --token-file F. Every such request proves the holder it commits or renews
(only the process that reserved an attempt can settle it), and a reserve re-dispatches over
an unknown outcome only for an operation named by --upstream-idempotent.
docs/shared-store.md.

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
	fl.StringVar(&f.tokenFile, "token-file", "", fmt.Sprintf("bearer tokens for --http (\"TOKEN [NAMESPACE [ledger]]\" lines or JSON; each token at least %d bytes)", mcpwire.MinTokenLen))
	fl.BoolVar(&f.stateless, "stateless", false, "serve HTTP clients of protocol versions up to 2025-11-25 without sessions")
	fl.DurationVar(&f.lease, "lease", interceptor.DefaultLeaseTTL, "lease of a begin_call without lease_ms")
	fl.IntVar(&f.maxArgs, "max-args", interceptor.DefaultMaxArgs, "largest begin_call args accepted, in bytes")
	a.addTelemetryFlags(fl, &f.metrics)
	a.postgresFlags(cmd)
	fl.IntVar(&f.minFree, "min-free-mib", badger.DefaultMinFree>>20, "embedded store: refuse new reservations (unavailable) while its filesystem has less free space, in MiB (resolutions and evidence below half; calls in flight still commit)")
	fl.StringSliceVar(&f.upstreamIdempotent, "upstream-idempotent", nil, "operation (repeatable, or comma-separated) declared upstream-idempotent: its /ledger/v1 reserves may re-dispatch over an unknown outcome under the same key")
	f.net.add(fl)
	return cmd
}

func (a *app) serve(cmd *cobra.Command, f serveFlags) error {
	if f.stdio == (f.http != "") {
		return usagef("give exactly one of --stdio or --http ADDR")
	}
	if f.stdio && (f.tokenFile != "" || len(f.upstreamIdempotent) > 0) {
		return usagef("--token-file and --upstream-idempotent apply to --http only")
	}
	if f.lease <= 0 || f.maxArgs <= 0 || f.minFree <= 0 {
		return usagef("--lease, --max-args and --min-free-mib must be positive")
	}
	if uint64(f.minFree)<<20 < badger.LeastMinFree {
		return usagef("--min-free-mib %d is too small: the embedded store needs at least %d MiB (it stops every write at half of that, to keep room for badger's own flushes)",
			f.minFree, badger.LeastMinFree>>20)
	}
	log, err := a.logger()
	if err != nil {
		return err
	}
	opts := mcpserver.Options{HTTPStateless: f.stateless, Version: buildVersion(), Logger: log}
	if err := f.net.apply(&opts); err != nil {
		return err
	}
	if f.http != "" {
		tokens, err := loadServeTokens(f.tokenFile, a.namespace)
		if err != nil {
			return usagef("%v", err)
		}
		if err := mcpwire.CheckBind(f.http, tokens.Len()); err != nil {
			return usagef("%v", err)
		}
		opts.Tokens = tokens
	}
	ctx := cmd.Context()
	a.minFree = uint64(f.minFree) << 20 // the owner of a badger store guards its space
	l, err := a.open(ctx, false)
	if err != nil {
		return err
	}
	defer l.Close()
	if f.http != "" {
		opts.Handlers = map[string]http.Handler{remote.Path: ledgerHandler(l, opts.Tokens, a.namespace, f.upstreamIdempotent, f.net.ledgerLimits())}
	}
	stop, err := a.observe(ctx, f.metrics, l, log)
	if err != nil {
		return err
	}
	defer stop()
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
func loadServeTokens(file, namespace string) (mcpwire.Tokens, error) {
	if file != "" {
		return mcpwire.LoadTokens(file, namespace)
	}
	var t mcpwire.Tokens
	if tok := strings.TrimSpace(os.Getenv(tokenEnv)); tok != "" {
		if err := t.Add(tok, namespace); err != nil {
			return mcpwire.Tokens{}, fmt.Errorf("$%s: %w", tokenEnv, err)
		}
	}
	return t, nil
}

// ledgerHandler serves l over the ledger protocol (ledger/remote) for serve --http: to the
// tokens granted it (TOKEN NAMESPACE ledger), each bound to its namespace, or, without tokens
// (a loopback address only, as for /mcp), bound to namespace. Reserves re-dispatch over an
// unknown outcome only for the operations in idempotent (--upstream-idempotent).
func ledgerHandler(l ledger.Ledger, tokens mcpwire.Tokens, namespace string, idempotent []string, limits remote.HandlerOptions) http.Handler {
	declared := func(op string) bool { return slices.Contains(idempotent, op) }
	auth := remote.GrantedTokens(tokens.Ledger, declared)
	if tokens.Len() == 0 {
		auth = func(*http.Request) (remote.Access, error) {
			return remote.Access{Namespace: namespace, UpstreamIdempotent: declared}, nil
		}
	}
	limits.Authorize = auth
	return remote.Handler(l, limits)
}

func serving(w io.Writer, addr net.Addr, tokens mcpwire.Tokens) {
	auth := fmt.Sprintf("%d bearer token(s)", tokens.Len())
	if tokens.Len() == 0 {
		auth = "no bearer token: loopback only, unauthenticated"
	}
	fmt.Fprintf(w, "toolfence: serving MCP at http://%s%s (%s)\n", addr, mcpwire.Path, auth)
}
