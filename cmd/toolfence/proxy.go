package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/httpserve"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
)

func init() { register(newProxyCmd) }

type proxyFlags struct {
	config      string
	serverID    string
	task        string
	lease       time.Duration
	timeout     time.Duration
	metrics     string
	upstreamURL string
	headers     []string
	header      http.Header // parsed headers, set by check
	http        string
	tokenFile   string
	net         netFlags
	pins        string
	repeatWin   time.Duration
	roundWait   time.Duration
	maxChildren int
}

func newProxyCmd(a *app) *cobra.Command {
	var f proxyFlags
	cmd := &cobra.Command{
		Use:   "proxy [--store DIR] [--config FILE] [--pins FILE] --server-id ID [--task T] [--http ADDR --token-file F] (-- CMD ARGS... | --upstream URL [--header NAME=VALUE]...)",
		Short: "Guard any MCP server: relay an MCP host to it and put every mutating tools/call through the barrier",
		Long: `Run an upstream MCP server behind toolfence. The upstream is either a command
(-- CMD ARGS..., started as a stdio child in its own process group) or a streamable-HTTP
server (--upstream URL; each --header NAME=VALUE is sent on every request, e.g.
--header "Authorization=Bearer $KEY"; values are never logged). Give exactly one.

Hosts reach the proxy on stdin/stdout (the default: put "toolfence proxy --store DIR
--server-id ID -- CMD ARGS..." where the host's configuration starts the server) or, with
--http ADDR, over streamable HTTP at http://ADDR/mcp. Over HTTP every request needs
"Authorization: Bearer TOKEN" with a token of --token-file (the format of serve: lines
"TOKEN NAMESPACE" or just "TOKEN" for --namespace, or JSON; not readable by other users) or
$` + tokenEnv + `; a missing or unknown token gets 401. Each token's calls are keyed in its
namespace. Each host session (MCP 2025-11-25 and before: initialize, Mcp-Session-Id) gets
its own upstream session: a child process per session (killed with its process group when
the session ends) or a new HTTP session upstream. Stateless hosts (2026-07-28) get no
session: their requests share one child. A session ends on DELETE, after --session-idle
without requests (default 5m with -- CMD, 30m with --upstream; with -- CMD an open
notification stream does not keep a session, only a request in progress does), or when its
token opens more than --max-sessions. With -- CMD at most --max-children sessions (default
16; each child takes some 11 MB for a Go server, 68 MB for a Node one) are open over all
tokens: a new one ends the least recently used idle session and waits for its child to
exit, or gets 429 with Retry-After when every session has a request in progress. --max-conns, --idle-timeout,
--read-timeout and --header-timeout bound connections as for serve. As for serve, a POST whose JSON nests deeper than --max-depth or
holds more than --max-values values gets 400 before it is decoded, and one past
--max-inflight requests in progress for its token (or --max-inflight-total over all tokens)
gets 429 with Retry-After; nothing of a refused request is relayed. Without any token only a
loopback ADDR is allowed.

Everything is relayed untouched (tools/list, resources, prompts, notifications) except
tools/call of protected tools. By default a tool annotated readOnlyHint: true is bypassed
and every other tool is protected; --config FILE (JSON or YAML, see docs/proxy.md) sets per
tool "mode" (protect / bypass), "target" (JSON pointers into the arguments), "lease",
"timeout", "no_effect" rules (JSON-RPC codes, patterns of isError text that prove nothing
happened), a "probe" (another upstream tool that says whether an unknown call took effect)
and "key" (where to send the idempotency key to an upstream that deduplicates by it).

With pins (--pins FILE, or FILE beside --config as .pins.json when it exists; written by
"toolfence proxy lock"), a protected tool whose definition changed upstream is refused until
it is locked again. "toolfence proxy check" shows what the proxy would do with each tool.

A protected call is reserved in the store before it is sent upstream and recorded after:
  - an answer that may have had an effect (isError without a matching no_effect rule, a
    timeout, a crash, an HTTP upstream that drops the connection, answers 5xx or garbage)
    is unknown: later calls on the key are refused until it is settled (a probe, tasks/get,
    "toolfence resolve", or the host's user when the host supports elicitation);
  - the host's cancellation does not cut a call off upstream: it runs to its answer, which
    is recorded, so the host's retry is answered from the store;
  - an answer of resultType input_required (MCP 2026-07-28) is a round of one call: the
    host's continuation goes upstream under the same attempt; a round not continued within
    --round-timeout is recorded failed;
  - the same target with other arguments is refused as a payload mismatch.
Refusals are isError results that tell the model what to do; nothing is sent upstream.

Keys: operation "<server-id>/<tool>"; target from the policy's pointers, else the digest
of the arguments; task from the request's _meta "toolfence.dev/task", else --task, else
"mcp-proxy:<server-id>". The same call again (same task, tool and arguments) after one
that succeeded:
  - is answered from the store ("[replayed] not sent: ..." first, _meta
    "toolfence.dev/replayed": true) while its earlier answer may not have reached the host
    (a retry), and always when the call names its task, or the tool's policy has a target
    or a key (policy "repeats": "replay");
  - is sent again as a new intent once the host had the earlier answer and another call of
    the same tool began since, or --repeat-window (default 10m) has passed since;
  - otherwise (soon after, nothing in between) the host's user is asked whether to run it
    again (elicitation), and without elicitation it is answered from the store, saying so.
docs/proxy.md "The same call again" has the rule and its trade-offs.

Telemetry and logs as for serve (nothing is exported by default; stdout stays the MCP
stream, everything else goes to stderr): --metrics 127.0.0.1:9464 serves Prometheus metrics
at http://127.0.0.1:9464/metrics, without authentication; with OTEL_EXPORTER_OTLP_ENDPOINT
set, traces and metrics are exported over OTLP/HTTP. Logs (--log-format text|json,
--log-level) have one line per refused or ambiguous call with its key and recovery, never
arguments or results. A tools/call's span joins the host's trace when the request carries
W3C traceparent/tracestate in params._meta, and a protected call passes the trace on to
upstream in its _meta. Reference: docs/observability.md.

Example:
  toolfence proxy --store ~/.toolfence --server-id mail --config mail-policy.json -- npx mail-mcp
  toolfence proxy --server-id mail --metrics 127.0.0.1:9464 --log-format json -- npx mail-mcp
  toolfence proxy --server-id pay --upstream https://pay.example/mcp --header "Authorization=Bearer $PAY_KEY"
  toolfence proxy --server-id mail --http 127.0.0.1:7788 --token-file ./tokens -- npx mail-mcp`,
		RunE: func(cmd *cobra.Command, args []string) error { return a.proxy(cmd, &f, args) },
	}
	cmd.Flags().StringVar(&f.config, "config", "", "policy file (JSON or YAML): per tool mode, target, lease, timeout, no_effect, probe, key; see docs/proxy.md")
	cmd.Flags().StringVar(&f.serverID, "server-id", "", "id of the upstream in keys (operation ID/tool); required, keep it stable")
	cmd.Flags().StringVar(&f.task, "task", "", "task of calls whose _meta names none (default \"mcp-proxy:<server-id>\", stable across restarts)")
	cmd.Flags().DurationVar(&f.lease, "lease", 0, "lease of each attempt (default 30s; a tool's policy may set its own)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 0, "wait for upstream's answer before the outcome is unknown (default 2m)")
	cmd.Flags().DurationVar(&f.repeatWin, "repeat-window", mcpproxy.DefaultRepeatWindow,
		"an identical call soon after the host had the answer of one that succeeded is a possible retry for this long, then a new intent; 0: always a new intent once the host had the answer")
	cmd.Flags().DurationVar(&f.roundWait, "round-timeout", mcpproxy.DefaultRoundTimeout, "wait this long for the host to continue a call upstream answered input_required, then record it failed")
	cmd.Flags().StringVar(&f.upstreamURL, "upstream", "", "URL of a streamable-HTTP upstream MCP server (instead of -- CMD ARGS...)")
	cmd.Flags().StringArrayVar(&f.headers, "header", nil, "--upstream: a header NAME=VALUE sent on every request upstream (repeatable; values are never logged)")
	cmd.Flags().StringVar(&f.http, "http", "", "serve hosts over streamable HTTP at ADDR (host:port), endpoint /mcp, instead of stdio")
	cmd.Flags().StringVar(&f.tokenFile, "token-file", "", "--http: bearer tokens (\"TOKEN [NAMESPACE]\" lines or JSON, as serve's); each token's sessions live in its namespace")
	cmd.Flags().StringVar(&f.pins, "pins", "", "catalog pins (toolfence proxy lock); default: the --config path with .pins.json, when it exists")
	f.net.addShared(cmd.Flags())
	// A session with a stdio upstream holds a child process: it ends sooner by default.
	idle := cmd.Flags().Lookup("session-idle")
	idle.DefValue = mcpwire.DefaultChildIdle.String() + " with -- CMD, " + mcpwire.DefaultSessionIdle.String() + " with --upstream"
	idle.Usage = "--http: end a session and its upstream session (a child process with -- CMD) after this long without requests; with -- CMD an open notification stream does not count"
	cmd.Flags().IntVar(&f.maxChildren, "max-children", mcpwire.DefaultMaxChildren,
		"--http with -- CMD: sessions (each with a child process) open at once over all tokens; a new one ends the least recently used idle one, else gets 429")
	a.addTelemetryFlags(cmd.Flags(), &f.metrics)
	a.postgresFlags(cmd)
	cmd.AddCommand(newProxyLockCmd(a), newProxyCheckCmd(a))
	return cmd
}

// check validates the upstream flags and args: exactly one of --upstream URL and -- CMD,
// well-formed URL and headers, --header only with --upstream, the command findable.
func (f *proxyFlags) check(cmd *cobra.Command, args []string) error {
	hasCmd := len(args) > 0
	switch {
	case hasCmd && cmd.ArgsLenAtDash() != 0:
		return usagef("unexpected arguments %q: give the upstream server's command after --", args)
	case hasCmd && f.upstreamURL != "":
		return usagef("give one upstream: --upstream URL or a command after --, not both")
	case !hasCmd && f.upstreamURL == "":
		return usagef("give the upstream server's command after --, e.g. toolfence proxy --server-id mail -- npx mail-mcp, or its URL with --upstream URL")
	case len(f.headers) > 0 && f.upstreamURL == "":
		return usagef("--header applies to --upstream URL only (a stdio child gets its settings from its command line and environment)")
	}
	if f.upstreamURL != "" {
		if _, err := transport.CheckUpstreamURL(f.upstreamURL); err != nil {
			return usagef("--upstream: %v", err)
		}
		h, err := transport.ParseHeaders(f.headers)
		if err != nil {
			return usagef("--header: %v", err)
		}
		f.header = h
	}
	return nil
}

// upstream opens one upstream session: a connection to --upstream URL (with the --header
// values), or the command of args started as a stdio child in its own process group.
// Closing the closer ends it (the child's process group is killed). Call check first: it
// parses the headers. Every subcommand that talks to the upstream (proxy, lock, check)
// opens it here.
func (f *proxyFlags) upstream(ctx context.Context, args []string, stderr io.Writer, log *slog.Logger) (mcp.Connection, io.Closer, error) {
	if f.upstreamURL != "" {
		conn, err := transport.HTTPUpstream{URL: f.upstreamURL, Header: f.header, Logger: log}.Connect(ctx)
		if err != nil {
			return nil, nil, err
		}
		return conn, conn, nil
	}
	up, err := transport.StartUpstream(ctx, args, stderr)
	if err != nil {
		return nil, nil, err
	}
	return up.Conn(), up, nil
}

func (a *app) proxy(cmd *cobra.Command, f *proxyFlags, args []string) error {
	if err := f.check(cmd, args); err != nil {
		return err
	}
	if f.serverID == "" {
		return usagef("--server-id is required: it names the upstream in every key (operation <server-id>/<tool>); keep it stable")
	}
	if f.tokenFile != "" && f.http == "" {
		return usagef("--token-file applies to --http only")
	}
	if err := policy.CheckServerID(f.serverID); err != nil {
		return usagef("--server-id: %v", err)
	}
	switch {
	case f.timeout < 0:
		return usagef("--timeout %v is negative", f.timeout)
	case f.lease < 0:
		return usagef("--lease %v is negative", f.lease)
	case f.repeatWin < 0:
		return usagef("--repeat-window %v is negative (0 turns the window off)", f.repeatWin)
	case f.roundWait <= 0:
		return usagef("--round-timeout %v must be positive", f.roundWait)
	}
	if f.lease != 0 && f.lease <= lease.DefaultMargin {
		return usagef("--lease %v is not longer than the safety margin %v", f.lease, lease.DefaultMargin)
	}
	pol, pins, err := loadPolicyAndPins(f.config, f.pins, f.serverID)
	if err != nil {
		return err
	}
	if pol != nil {
		if err := pol.CheckLeases(lease.DefaultMargin); err != nil {
			return usagef("--config: %v", err)
		}
	}
	var tokens mcpwire.Tokens
	var limits httpserve.Limits
	if f.http != "" {
		if err := f.sessionBounds(cmd, len(args) > 0); err != nil {
			return err
		}
		var opts mcpserver.Options
		if err := f.net.applyProxy(&opts); err != nil {
			return err
		}
		limits = httpserve.Limits{MaxConns: opts.MaxConns, MaxConnsPerPeer: opts.MaxConnsPerPeer, IdleTimeout: opts.IdleTimeout, ReadTimeout: opts.ReadTimeout, ReadHeaderTimeout: opts.ReadHeaderTimeout}
		if err := limits.Validate(); err != nil {
			return usagef("%v", err)
		}
		var err error
		if tokens, err = loadServeTokens(f.tokenFile, a.namespace); err != nil {
			return usagef("%v", err)
		}
		if err := mcpwire.CheckBind(f.http, tokens.Len()); err != nil {
			return usagef("%v", err)
		}
	}
	if len(args) > 0 {
		// Find the command before the store is opened (a typo must not leave a store
		// behind) and, over --http, where children start per session, before any host.
		if _, err := exec.LookPath(args[0]); err != nil {
			return fmt.Errorf("starting upstream %q: %w", args[0], err)
		}
	}
	log, err := a.logger()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	l, err := a.open(ctx, false)
	if err != nil {
		return err
	}
	defer l.Close()
	stop, err := a.observe(ctx, f.metrics, l, log)
	if err != nil {
		return err
	}
	defer stop()
	ic, err := interceptor.New(l, interceptor.Options{Namespace: a.namespace, LeaseTTL: f.lease, Logger: log})
	if err != nil {
		return usagef("%v", err)
	}
	repeatWin := f.repeatWin
	if repeatWin == 0 {
		repeatWin = -1 // no window
	}
	p, err := mcpproxy.New(ic, mcpproxy.Options{ServerID: f.serverID, Task: f.task, Policy: pol, Timeout: f.timeout, Logger: log, Pins: pins,
		RepeatWindow: repeatWin, RoundTimeout: f.roundWait})
	if err != nil {
		return usagef("%v", err)
	}
	if f.http == "" {
		up, closer, err := f.upstream(ctx, args, a.stderr, log)
		if err != nil {
			return err
		}
		defer closer.Close()
		err = p.Serve(ctx, transport.Stdio(cmd.InOrStdin(), a.stdout), up)
		if u, ok := closer.(*transport.Upstream); ok && (errors.Is(err, mcpproxy.ErrUpstreamGone) || errors.Is(err, syscall.EPIPE)) && ctx.Err() == nil {
			// Not stopped by a signal: say how the upstream ended, if it did.
			if state, ended := u.Exit(2 * time.Second); ended {
				err = fmt.Errorf("%w: upstream %q ended (%s)", err, args[0], state)
			}
		}
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return nil // stopped by SIGTERM or SIGINT: a normal end, as serve's
		}
		return err
	}
	h, err := p.NewHTTPServer(mcpproxy.HTTPOptions{
		Dial: func(ctx context.Context) (mcp.Connection, io.Closer, error) {
			return f.upstream(ctx, args, a.stderr, log)
		},
		SharedUpstream: len(args) > 0, // a stdio child: stateless hosts share one
		Children:       len(args) > 0, MaxChildren: f.maxChildren,
		Tokens: tokens, MaxSessions: f.net.maxSessions, SessionIdle: f.net.sessionIdle, Logger: log,
		MaxDepth: f.net.maxDepth, MaxValues: f.net.maxValues, MaxInFlight: f.net.maxInFlight, MaxInFlightTotal: f.net.maxTotal,
	})
	if err != nil {
		return usagef("%v", err)
	}
	defer h.Close()
	return h.ListenAndServe(ctx, f.http, limits, func(addr net.Addr) { serving(a.stderr, addr, tokens) })
}

// sessionBounds sets the default of --session-idle by the upstream (children: a stdio
// upstream, a child process per session) and checks --max-children: positive, and given
// only with a stdio upstream.
func (f *proxyFlags) sessionBounds(cmd *cobra.Command, children bool) error {
	if !cmd.Flags().Changed("session-idle") {
		f.net.sessionIdle = mcpwire.DefaultSessionIdle
		if children {
			f.net.sessionIdle = mcpwire.DefaultChildIdle
		}
	}
	switch {
	case f.maxChildren <= 0:
		return usagef("--max-children must be positive")
	case !children && cmd.Flags().Changed("max-children"):
		return usagef("--max-children applies to a stdio upstream (-- CMD) only: an --upstream session starts no process")
	}
	return nil
}

// applyProxy checks the limits addShared adds, refusing values that are not positive, and
// copies them into opts.
func (n netFlags) applyProxy(opts *mcpserver.Options) error {
	for name, v := range map[string]int64{
		"--max-conns": int64(n.maxConns), "--idle-timeout": int64(n.idleTimeout), "--read-timeout": int64(n.readTimeout),
		"--header-timeout": int64(n.headerTimeout), "--session-idle": int64(n.sessionIdle), "--max-sessions": int64(n.maxSessions),
		"--max-depth": int64(n.maxDepth), "--max-values": int64(n.maxValues), "--max-inflight": int64(n.maxInFlight),
		"--max-inflight-total": int64(n.maxTotal),
	} {
		if v <= 0 {
			return usagef("%s must be positive", name)
		}
	}
	opts.MaxConns, opts.IdleTimeout, opts.ReadTimeout, opts.ReadHeaderTimeout = n.maxConns, n.idleTimeout, n.readTimeout, n.headerTimeout
	opts.SessionIdle, opts.MaxSessions = n.sessionIdle, n.maxSessions
	opts.MaxDepth, opts.MaxValues, opts.MaxInFlight, opts.MaxInFlightTotal = n.maxDepth, n.maxValues, n.maxInFlight, n.maxTotal
	return n.applyPerPeer(opts)
}
