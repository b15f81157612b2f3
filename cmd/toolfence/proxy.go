package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpproxy"
)

func init() { register(newProxyCmd) }

type proxyFlags struct {
	config   string
	serverID string
	task     string
	lease    time.Duration
	timeout  time.Duration
	metrics  string
	pins     string
}

func newProxyCmd(a *app) *cobra.Command {
	var f proxyFlags
	cmd := &cobra.Command{
		Use:   "proxy [--config FILE] --server-id ID [--task T] [--metrics ADDR] -- CMD ARGS...",
		Short: "Guard any MCP server: relay an MCP host to it and put every mutating tools/call through the barrier",
		Long: `Run an upstream MCP server (CMD ARGS..., started as a stdio child in its own process
group) behind toolfence, speaking MCP to the host on stdin/stdout: put "toolfence proxy
--store DIR --server-id ID -- CMD ARGS..." where the host's configuration starts the server.
First version: stdio only on both sides; see docs/proxy.md for what is not built yet.

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
  - the same call again (same task, tool, target and arguments) is answered from the store
    ("[replayed] ..." first, _meta "toolfence.dev/replayed": true), not sent again;
  - an answer that may have had an effect (isError without a matching no_effect rule, a
    timeout, a crash, a cancellation) is unknown: later calls on the key are refused until it
    is settled with "toolfence resolve";
  - the same target with other arguments is refused as a payload mismatch.
Refusals are isError results that tell the model what to do; nothing is sent upstream.

Keys: operation "<server-id>/<tool>"; target from the policy's pointers, else the digest
of the arguments; task from the request's _meta "toolfence.dev/task", else --task, else
"mcp-proxy:<server-id>". That default never changes, so repeating a call on purpose later
replays the first result: give a new --task (or _meta task) to start new work.

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
  toolfence proxy --server-id mail --metrics 127.0.0.1:9464 --log-format json -- npx mail-mcp`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 0 || len(args) == 0 {
				return usagef("give the upstream server's command after --, e.g. toolfence proxy --server-id mail -- npx mail-mcp")
			}
			if f.serverID == "" {
				return usagef("--server-id is required: it names the upstream in every key (operation <server-id>/<tool>); keep it stable")
			}
			pol := &mcpproxy.Policy{}
			if f.config != "" {
				var err error
				if pol, err = mcpproxy.LoadPolicy(f.config); err != nil {
					return usagef("--config: %v", err)
				}
			}
			pins, err := loadProxyPins(f.pins, f.config, f.serverID)
			if err != nil {
				return err
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
			p, err := mcpproxy.New(ic, mcpproxy.Options{ServerID: f.serverID, Task: f.task, Policy: pol, Timeout: f.timeout, Logger: log, Pins: pins})
			if err != nil {
				return usagef("%v", err)
			}
			up, err := mcpproxy.StartUpstream(ctx, args, a.stderr)
			if err != nil {
				return err
			}
			defer up.Close()
			return p.Serve(ctx, mcpproxy.Stdio(cmd.InOrStdin(), a.stdout), up.Conn())
		},
	}
	cmd.Flags().StringVar(&f.config, "config", "", "policy file (JSON or YAML): per tool mode, target, lease, timeout, no_effect, probe, key; see docs/proxy.md")
	cmd.Flags().StringVar(&f.serverID, "server-id", "", "id of the upstream in keys (operation ID/tool); required, keep it stable")
	cmd.Flags().StringVar(&f.task, "task", "", "task of calls whose _meta names none (default \"mcp-proxy:<server-id>\", stable across restarts)")
	cmd.Flags().DurationVar(&f.lease, "lease", 0, "lease of each attempt (default 30s; a tool's policy may set its own)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 0, "wait for upstream's answer before the outcome is unknown (default 2m)")
	cmd.Flags().StringVar(&f.pins, "pins", "", "catalog pins (toolfence proxy lock); default: the --config path with .pins.json, when it exists")
	a.addTelemetryFlags(cmd.Flags(), &f.metrics)
	cmd.AddCommand(newProxyLockCmd(a), newProxyCheckCmd(a))
	return cmd
}
