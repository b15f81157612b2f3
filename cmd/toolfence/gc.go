package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// defaultGCAge is how old a settled residual must be before gc deletes it: 30 days.
const defaultGCAge = 720 * time.Hour

type gcFlags struct {
	olderThan age
	dryRun    bool
	json      bool
}

func newGCCmd(a *app) *cobra.Command {
	f := gcFlags{olderThan: age(defaultGCAge)}
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Delete settled residuals older than a cutoff",
		Long: `Delete the succeeded and failed residuals of the namespace that were last updated more than
--older-than ago, and print how many. Pending, unknown and accepted residuals are never
deleted: they still need a holder, a probe or a person. Fencing tokens survive: a key used
again after gc gets a higher token than before (PostgreSQL keeps a tombstone row holding the
key and its last token, which no read shows).

After gc, a call with a deleted key runs again instead of replaying, so keep residuals at
least as long as agents may retry a task. --dry-run counts without deleting.

--older-than takes a number of days (30d) or a Go duration in hours, minutes or seconds
(36h, 90m, 45s; they combine: 1h30m). m is minutes: 1m is one minute, not a month. There
is no unit for months, weeks or years; write them in days (30d, 7d, 365d). Units other
than d, h, m, s, ms, us and ns are refused.

Example:
  toolfence gc                          # settled residuals older than 30 days
  toolfence gc --older-than 7d --dry-run`,
		Args: args(),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.gc(cmd.Context(), f) },
	}
	fl := cmd.Flags()
	fl.Var(&f.olderThan, "older-than", "delete settled residuals last updated longer ago than this: days (30d) or a Go duration (36h, 90m; m is minutes)")
	fl.BoolVar(&f.dryRun, "dry-run", false, "count what would be deleted, delete nothing")
	fl.BoolVar(&f.json, "json", false, `print {"namespace","before","dry_run","count"} as JSON`)
	a.tokenFlags(cmd)
	a.postgresFlags(cmd)
	return cmd
}

func (a *app) gc(ctx context.Context, f gcFlags) error {
	l, err := a.open(ctx, true)
	if err != nil {
		return err
	}
	defer l.Close()
	before := timeNow().Add(-time.Duration(f.olderThan))
	n := 0
	if f.dryRun {
		p := ledger.ListParams{
			Namespace: a.namespace, States: []residual.State{residual.Succeeded, residual.Failed},
			Limit: ledger.MaxListLimit,
		}
		for {
			page, err := l.List(ctx, p)
			if err != nil {
				return fmt.Errorf("listing settled residuals: %w", err)
			}
			for _, r := range page.Residuals {
				if r.UpdatedAt.Before(before) {
					n++
				}
			}
			if p.Cursor = page.NextCursor; p.Cursor == "" {
				break
			}
		}
	} else {
		res, err := l.GC(ctx, ledger.GCParams{Namespace: a.namespace, Before: before})
		if err != nil {
			return fmt.Errorf("gc: %w", err)
		}
		n = res.Deleted
	}
	if f.json {
		return writeJSONLine(a.stdout, map[string]any{
			"namespace": a.namespace, "before": before.UTC(), "dry_run": f.dryRun, "count": n,
		})
	}
	verb := "deleted"
	if f.dryRun {
		verb = "would delete"
	}
	_, err = fmt.Fprintf(a.stdout, "%s %d settled residual(s) in namespace %s last updated before %s (older than %s)\n",
		verb, n, a.namespace, stamp(before), f.olderThan.String())
	return err
}

// age is a non-negative duration flag that also takes whole days ("30d").
type age time.Duration

func (d *age) String() string {
	v := time.Duration(*d)
	if v > 0 && v%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(v/(24*time.Hour)), 10) + "d"
	}
	return v.String()
}

func (d *age) Set(s string) error {
	var v time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseUint(days, 10, 32)
		if err != nil {
			return fmt.Errorf("%q: want a number of days like 30d, or a duration like 720h", s)
		}
		v = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if v, err = time.ParseDuration(s); err != nil {
			return fmt.Errorf("%q: want a number of days like 30d, or a duration in h, m (minutes) or s like 720h; "+
				"months, weeks and years have no unit: write them in days (30d, 7d, 365d)", s)
		}
	}
	if v < 0 {
		return fmt.Errorf("%q: the age must not be negative", s)
	}
	*d = age(v)
	return nil
}

func (d *age) Type() string { return "duration" }
