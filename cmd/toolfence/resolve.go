package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

type resolveFlags struct {
	as     string
	note   string
	by     string
	result string
	json   bool
}

func newResolveCmd(a *app) *cobra.Command {
	var f resolveFlags
	cmd := &cobra.Command{
		Use:   "resolve KEY --as succeeded|failed --note TEXT",
		Short: "Settle an unknown or accepted residual by hand, with a note for the audit",
		Long: `Settle the residual of KEY as succeeded or failed, once you know what happened upstream
(a payment dashboard, the recipient's inbox, the deploy log).

Only unknown and accepted residuals can be resolved: a pending one may still be in flight
(wait until its lease expires), and a settled one stays as it is. Resolving takes a new
fencing token, so a late commit of the old holder is refused, and records who resolved it,
when and why. After "succeeded", a new call with the same arguments replays the result
(--result sets it: a JSON value, so text goes in JSON quotes); after "failed", a new call
runs as a new attempt. KEY is a whole key or a unique prefix, as for show.

With --server URL (or $TOOLFENCE_SERVER) resolve acts through a running
` + "`toolfence serve --http`" + ` instead of opening the store, in the namespace of your bearer
token (--token, --token-file or $TOOLFENCE_TOKEN).

Example:
  toolfence resolve tf1_3f1c09e2 --as succeeded --note "charge ch_1 is in the Stripe dashboard" \
      --result '{"id":"ch_1","status":"succeeded"}'
  toolfence resolve tf1_7a0b55d1 --as succeeded --note "seen in the outbox" --result '"sent ok"'
  toolfence resolve tf1_3f1c09e2 --as failed --note "no email in the provider's log" --by alice
  toolfence resolve tf1_3f1c09e2 --as failed --note "not in the log" --server http://127.0.0.1:7777`,
		Args: args("KEY"),
		RunE: func(cmd *cobra.Command, argv []string) error { return a.resolve(cmd, argv[0], f) },
	}
	a.serverFlags(cmd)
	a.postgresFlags(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.as, "as", "", "the outcome: succeeded or failed (required)")
	fl.StringVar(&f.note, "note", "", "why: what you checked upstream (required, kept in the audit)")
	fl.StringVar(&f.by, "by", "", "who resolves, for the audit (default cli:USER@HOST)")
	fl.StringVar(&f.result, "result", "", `JSON result to replay to later calls (only with --as succeeded); quote text as a JSON string: '"sent ok"'`)
	fl.BoolVar(&f.json, "json", false, "print the resolved residual as JSON")
	return cmd
}

func (a *app) resolve(cmd *cobra.Command, arg string, f resolveFlags) error {
	ctx := cmd.Context()
	if err := checkKey(arg); err != nil {
		return err
	}
	p := ledger.ResolveParams{Namespace: a.namespace, Note: strings.TrimSpace(f.note), By: cmp.Or(f.by, defaultBy())}
	switch f.as {
	case "succeeded", "failed":
		p.As = residual.State(f.as)
	case "":
		return usagef("--as is required: succeeded or failed")
	default:
		return usagef("--as %q: want succeeded or failed (a residual can only be settled; pending, unknown and accepted are not outcomes you can choose)", f.as)
	}
	if p.Note == "" {
		return usagef("--note is required: say what you checked upstream; it is kept in the residual's audit")
	}
	if f.result != "" {
		if p.As != residual.Succeeded {
			return usagef("--result only goes with --as succeeded: a failed call has no result to replay")
		}
		if !json.Valid([]byte(f.result)) {
			q, _ := json.Marshal(f.result)
			return usagef("--result %q is not JSON: it is replayed to later calls as JSON; to record text, quote it as a JSON string: --result %s",
				f.result, shellQuote(string(q)))
		}
		p.Result = []byte(f.result)
	}

	l, err := a.records(cmd)
	if err != nil {
		return err
	}
	defer l.Close()
	key, err := findKey(ctx, l, arg)
	if err != nil {
		return err
	}
	p.Key = key
	r, err := l.resolve(ctx, p)
	if err != nil {
		return explainResolve(ctx, l, key, err)
	}
	if f.json {
		return writeResidualJSON(a.stdout, r)
	}
	from := residual.None
	if n := len(r.Resolutions); n > 0 {
		from = r.Resolutions[n-1].From
	}
	_, err = fmt.Fprintf(a.stdout, "resolved %s: %s → %s by %s (fencing token %d)\n", key, from, r.State, safe(p.By), r.Token)
	return err
}

// explainResolve turns a refused resolution into a message that says why and what to do.
func explainResolve(ctx context.Context, l records, key string, err error) error {
	switch {
	case errors.Is(err, residual.ErrNotFound):
		return fmt.Errorf("no residual %s in %s", key, l.where())
	case errors.Is(err, residual.ErrInProgress):
		r, gerr := l.get(ctx, key)
		if gerr != nil || r.Current() == nil {
			return fmt.Errorf("cannot resolve %s: it is in progress under a live lease; wait until the lease expires: %w", key, err)
		}
		cur := r.Current()
		return fmt.Errorf("cannot resolve %s: it is in progress: attempt %d by %s holds the lease until %s (%s) and may still be running; "+
			"wait until the lease expires (it then reads as unknown), then resolve it", key, cur.N, safe(cur.Holder), stamp(cur.LeaseExpires), until(cur.LeaseExpires, timeNow()))
	case errors.Is(err, residual.ErrInvalidTransition):
		if r, gerr := l.get(ctx, key); gerr == nil {
			return fmt.Errorf("cannot resolve %s: it is already %s; only unknown or accepted residuals can be resolved", key, r.State)
		}
		return fmt.Errorf("cannot resolve %s: %w", key, err)
	}
	return fmt.Errorf("resolving %s: %w", key, err)
}

// defaultBy names the person resolving: cli:USER@HOST.
func defaultBy() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	return "cli:" + cmp.Or(name, "unknown") + "@" + cmp.Or(host, "unknown-host")
}
