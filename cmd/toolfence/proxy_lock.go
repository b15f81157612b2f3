package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpproxy/policy"
)

// upstreamFlags name an upstream server for `proxy lock` and `proxy check`.
type upstreamFlags struct {
	config   string
	pins     string
	serverID string
	caps     []string   // --capabilities: what the initialize declares
	up       proxyFlags // --upstream and --header, read by its check and upstream
}

func (f *upstreamFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.config, "config", "", "policy file (JSON or YAML), as for proxy")
	cmd.Flags().StringVar(&f.pins, "pins", "", "pins file (default: the --config path with its extension replaced by .pins.json)")
	cmd.Flags().StringVar(&f.serverID, "server-id", "", "id of the upstream in keys, as for proxy; required")
	cmd.Flags().StringVar(&f.up.upstreamURL, "upstream", "", "URL of a streamable-HTTP upstream MCP server (instead of -- CMD ARGS...)")
	cmd.Flags().StringArrayVar(&f.up.headers, "header", nil, "--upstream: a header NAME=VALUE sent on every request upstream (repeatable; values are never logged)")
	cmd.Flags().StringSliceVar(&f.caps, "capabilities", clientCapabilities, "client capabilities the initialize declares, as hosts do (a server may list some tools only to hosts that declare one); --capabilities= declares none")
}

func (f *upstreamFlags) validate(cmd *cobra.Command, args []string) error {
	if err := f.up.check(cmd, args); err != nil {
		return err
	}
	if err := checkCapabilities(f.caps); err != nil {
		return err
	}
	if f.serverID == "" {
		return usagef("--server-id is required: the pins are taken for one server id, as the proxy uses it")
	}
	return nil
}

// listUpstream connects the upstream (--upstream URL or the command of args, through the
// proxy's one upstream function) and lists its tools, within 30 s, declaring the client
// capabilities of --capabilities.
func listUpstream(ctx context.Context, a *app, f *upstreamFlags, args []string) ([]policy.Tool, error) {
	log, err := a.logger()
	if err != nil {
		return nil, err
	}
	conn, closer, err := f.up.upstream(ctx, args, a.stderr, log)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return mcpproxy.ListTools(ctx, &capsConn{Connection: conn, caps: f.caps})
}

// pinsPath returns the pins file of the flags: --pins, else the default beside --config
// ("" when neither is given).
func pinsPath(pins, config string) string {
	if pins != "" {
		return pins
	}
	return mcpproxy.DefaultPinsPath(config)
}

// loadPolicyAndPins loads the policy of --config (nil without one: the zero policy) and
// the pins a proxy checks (loadProxyPins); a malformed file is a usage error naming it.
func loadPolicyAndPins(config, pins, serverID string) (*policy.Policy, *policy.Pins, error) {
	var pol *policy.Policy
	if config != "" {
		var err error
		if pol, err = mcpproxy.LoadPolicy(config); err != nil {
			return nil, nil, usagef("--config: %v", err)
		}
	}
	p, err := loadProxyPins(pins, config, serverID)
	if err != nil {
		return nil, nil, err
	}
	return pol, p, nil
}

// loadProxyPins loads the pins a proxy checks: --pins (which must exist), else the default
// beside --config when that file exists; nil when there are none. Pins of another server id
// than serverID are a usage error.
func loadProxyPins(pins, config, serverID string) (*policy.Pins, error) {
	path := pinsPath(pins, config)
	if path == "" {
		return nil, nil
	}
	if pins == "" {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
	}
	p, err := mcpproxy.LoadPins(path)
	if err != nil {
		return nil, usagef("--pins: %v", err)
	}
	if p.ServerID != serverID {
		return nil, usagef("--pins: %s: the pins were locked for server %q, not %q: check --server-id, or give this server its own pins file (toolfence proxy lock --server-id %s --pins FILE)", path, p.ServerID, serverID, serverID)
	}
	return p, nil
}

func newProxyLockCmd(a *app) *cobra.Command {
	var f upstreamFlags
	cmd := &cobra.Command{
		Use:   "lock [--config FILE] [--pins FILE] --server-id ID (-- CMD ARGS... | --upstream URL [--header K=V])",
		Short: "Pin the upstream's tool definitions: write the digest of each to the pins file",
		Long: `Start the upstream MCP server (CMD ARGS...) or connect to it (--upstream URL, with
--header NAME=VALUE), list its tools, and write the pins file: the server id and, per tool, the SHA-256 of the canonical JSON of its whole definition as the
upstream lists it. The file is replaced atomically.

A proxy given the pins (--pins, or the default beside --config) refuses every call of a
protected tool whose definition differs from its pin, or that has none, until a person has
reviewed the change and run lock again: a changed description or schema can change what a
call means. A tool the policy file bypasses (mode: bypass) is not checked; a pinned tool
bypassed only by its readOnlyHint annotation is, since a changed definition may be what
made it read-only. With --config, the policy is read first and must fit the upstream (the
problems "toolfence proxy check" reports refuse the lock): nothing is written otherwise.

The pins file is --pins, else the --config path with its extension replaced by
.pins.json (proxy.yaml → proxy.pins.json); one of them is required.

Its initialize declares the client capabilities sampling, elicitation and roots, as hosts
do (--capabilities names fewer; --capabilities= none): a server may list some tools only
to a host that declared one. A roots/list of the upstream is answered with no roots, a
sampling or elicitation request with an error.

Example:
  toolfence proxy lock --config mail.yaml --server-id mail -- npx mail-mcp`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.validate(cmd, args); err != nil {
				return err
			}
			path := pinsPath(f.pins, f.config)
			if path == "" {
				return usagef("give --pins FILE (or --config FILE: the pins then go beside it as .pins.json)")
			}
			var pol *policy.Policy
			if f.config != "" {
				var err error
				if pol, err = mcpproxy.LoadPolicy(f.config); err != nil {
					return usagef("--config: %v", err)
				}
			}
			list, err := listUpstream(cmd.Context(), a, &f, args)
			if err != nil {
				return err
			}
			if problems := policyProblems(f.serverID, pol, list); len(problems) > 0 {
				return fmt.Errorf("proxy lock: nothing written: the policy %s does not fit the upstream: %s (see toolfence proxy check)", f.config, strings.Join(problems, "; "))
			}
			pins, err := policy.Lock(f.serverID, list)
			if err != nil {
				return usagef("%v", err)
			}
			if err := mcpproxy.WritePins(path, pins); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "pinned %d tool(s) of server %s in %s\n", len(pins.Tools), f.serverID, path)
			return nil
		},
	}
	f.add(cmd)
	return cmd
}

// policyProblems are the problems proxy check reports for pol (nil: none) that it does not
// report without a policy: a tool or probe tool the policy names that the upstream does not
// list. (A tool definition that cannot be read is the upstream's problem, not the policy's.)
func policyProblems(serverID string, pol *policy.Policy, list []policy.Tool) []string {
	if pol == nil {
		return nil
	}
	without := policy.Check(serverID, nil, nil, list).Problems
	var out []string
	for _, p := range policy.Check(serverID, pol, nil, list).Problems {
		if !slices.Contains(without, p) {
			out = append(out, p)
		}
	}
	return out
}

func newProxyCheckCmd(a *app) *cobra.Command {
	var f upstreamFlags
	cmd := &cobra.Command{
		Use:   "check [--config FILE] [--pins FILE] --server-id ID (-- CMD ARGS... | --upstream URL [--header K=V])",
		Short: "Show what the proxy would do with each upstream tool: decision, target, pin, warnings",
		Long: `Start the upstream MCP server (CMD ARGS...) or connect to it (--upstream URL, with
--header NAME=VALUE), list its tools and print one line per tool: the decision (protect or bypass, and why), the target (the policy's JSON pointers, or
"digest of arguments": a re-worded retry is then not recognised), the pin status (ok,
missing, changed, unlisted; "no pins" without a pins file; "-" for bypassed tools) and
warnings: a pointer that names no property of the tool's inputSchema. Problems that refuse
every call follow: a tool or probe tool the policy names that the upstream does not list,
pins of another server id.

Its initialize declares the client capabilities sampling, elicitation and roots, as hosts
do (--capabilities names fewer; --capabilities= none): a server may list some tools only
to a host that declared one. A roots/list of the upstream is answered with no roots, a
sampling or elicitation request with an error.

Exit status 1 when some calls would be refused whatever their arguments (a problem, a pin
missing or changed, a pointer to a missing argument); 0 otherwise.

Example:
  toolfence proxy check --config mail.yaml --server-id mail -- npx mail-mcp`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.validate(cmd, args); err != nil {
				return err
			}
			pol, pins, err := loadPolicyAndPins(f.config, f.pins, f.serverID)
			if err != nil {
				return err
			}
			list, err := listUpstream(cmd.Context(), a, &f, args)
			if err != nil {
				return err
			}
			rep := policy.Check(f.serverID, pol, pins, list)
			printReport(a.stdout, rep)
			if rep.Refused() {
				return errors.New("proxy check: some calls would be refused (see above)")
			}
			return nil
		},
	}
	f.add(cmd)
	return cmd
}

// printReport prints a check report: a table, one line per tool, then the problems.
func printReport(w io.Writer, rep *policy.Report) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tDECISION\tTARGET\tPIN\tNOTES")
	for _, t := range rep.Tools {
		decision, target, pin := "bypass", "-", "-"
		if t.Protect {
			decision, target, pin = "protect", t.Target, t.Pin
		} else if t.Pin != "" {
			pin = t.Pin // a pinned tool is checked before it is bypassed
		}
		notes := append([]string{t.Why}, t.Warnings...)
		for i := range notes[1:] {
			notes[i+1] = "warning: " + notes[i+1]
		}
		if t.Refused {
			decision += " (refused)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Name, decision, target, pin, strings.Join(notes, "; "))
	}
	_ = tw.Flush()
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "problem: %s\n", p)
	}
}
