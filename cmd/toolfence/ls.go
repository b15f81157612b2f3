package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

type lsFlags struct {
	states    []string
	task      string
	operation string
	target    string
	limit     int
	cursor    string
	all       bool
	json      bool
	wide      bool
}

func newLsCmd(a *app) *cobra.Command {
	var f lsFlags
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List residuals, filtered by state, task, operation or target",
		Long: `List the residuals of a namespace, ordered by key, one page at a time.

The table fits 100 columns: the key abbreviated to a unique prefix (show and resolve take
it as it is), the effective state (a pending residual whose lease has expired reads as
unknown), the task and target of the call (cut with … when long), the operation with its
tool name whole (a proxy's SERVER/TOOL loses the server id first: …/TOOL; a longer tool
name takes width from the task and target columns), the current
attempt and when the residual last changed (UTC). --wide prints every column whole: the full
key, the holder of the current attempt and the time to the second. --json prints one
residual per line instead, with every field (the same record as show --json; results are
JSON values, or JSON strings when they are not JSON).

Text that agents supplied is printed with control characters escaped (\x1b, \n), so it
cannot forge lines or drive the terminal; --json prints it exactly.

Without --all one page of at most --limit residuals is printed; when there are more, a hint
on stderr gives the cursor of the next page. --all pages through everything.

With --server URL (or $TOOLFENCE_SERVER) ls asks a running ` + "`toolfence serve --http`" + `
instead of opening the store (which the server holds): it lists the open residuals
(pending, unknown, accepted; --state picks one of them) of the namespace of your bearer
token (--token, --token-file or $TOOLFENCE_TOKEN), in the same formats.

Example:
  toolfence ls --state unknown --state accepted     # everything that needs reconciling
  toolfence ls --task run-7 --json | jq .state
  toolfence ls --all --store postgres://toolfence@db/toolfence
  toolfence ls --server http://127.0.0.1:7777 --token-file ./my-token`,
		Args: args(),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.ls(cmd, f) },
	}
	a.serverFlags(cmd)
	a.postgresFlags(cmd)
	fl := cmd.Flags()
	fl.StringSliceVar(&f.states, "state", nil, "only residuals in this state: pending, unknown, accepted, succeeded or failed (repeat or comma-separate for several)")
	fl.StringVar(&f.task, "task", "", "only residuals of this task")
	fl.StringVar(&f.operation, "operation", "", "only residuals of this operation (tool name)")
	fl.StringVar(&f.target, "target", "", "only residuals of this target")
	fl.IntVar(&f.limit, "limit", ledger.DefaultListLimit, fmt.Sprintf("page size (at most %d)", ledger.MaxListLimit))
	fl.StringVar(&f.cursor, "cursor", "", "start at this cursor (printed when a page is not the last)")
	fl.BoolVar(&f.all, "all", false, "page through every matching residual")
	fl.BoolVar(&f.json, "json", false, "print one JSON residual per line")
	fl.BoolVar(&f.wide, "wide", false, "print the table with every column whole: full keys, holders, times to the second")
	return cmd
}

func (a *app) ls(cmd *cobra.Command, f lsFlags) error {
	ctx := cmd.Context()
	p := ledger.ListParams{
		Namespace: a.namespace, Task: f.task, Operation: f.operation, Target: f.target,
		Limit: f.limit, Cursor: f.cursor,
	}
	for _, name := range f.states {
		s, err := residual.ParseState(strings.TrimSpace(name))
		if err != nil {
			return usagef("--state: %v", err)
		}
		p.States = append(p.States, s)
	}
	if f.limit < 1 || f.limit > ledger.MaxListLimit {
		return usagef("--limit %d: want 1 to %d", f.limit, ledger.MaxListLimit)
	}
	if a.viaServer(cmd) && (len(p.States) > 1 || (len(p.States) == 1 && !p.States[0].Open())) {
		return usagef("--state %s: through --server, ls lists open residuals only: give at most one --state, pending, unknown or accepted "+
			"(a settled residual is read with show KEY)", strings.Join(f.states, ","))
	}
	l, err := a.records(cmd)
	if err != nil {
		return err
	}
	defer l.Close()

	var tw *tabwriter.Writer
	if !f.json {
		tw = tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	}
	n := 0
	for {
		page, err := l.list(ctx, p)
		if err != nil {
			return fmt.Errorf("listing residuals: %w", err)
		}
		short := shortKeys(page.Residuals)
		w := narrowWidths(page.Residuals)
		for _, r := range page.Residuals {
			n++
			if f.json {
				if err := writeJSONLine(a.stdout, toJSON(r)); err != nil {
					return err
				}
				continue
			}
			writeRow(tw, r, n == 1, f.wide, short, w)
		}
		if page.NextCursor == "" {
			break
		}
		if !f.all {
			if tw != nil {
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			fmt.Fprintf(a.stderr, "more residuals: use --all, or --cursor %s for the next page\n", page.NextCursor)
			return nil
		}
		p.Cursor = page.NextCursor
	}
	if tw != nil {
		if err := tw.Flush(); err != nil {
			return err
		}
		if n == 0 {
			fmt.Fprintf(a.stderr, "no residuals in %s match\n", l.where())
		}
	}
	return nil
}

// Column widths of the narrow ls table: with two spaces between columns it fits 100
// columns (12+9+14+12+18+7+16 + 6×2) unless a tool name is longer than the operation
// column and the task and target columns together can give (see narrowWidths).
const (
	shortKeyHex  = 8 // hex digits of an abbreviated key, more when a page needs them
	taskWidth    = 14
	opWidth      = 12
	targetWidth  = 18
	minWidth     = 6 // the least a task or target column shrinks to for a long tool name
	narrowLayout = "2006-01-02 15:04"
	wideLayout   = "2006-01-02T15:04:05Z"
)

// widths are the widths of the cut columns of the narrow ls table.
type widths struct{ task, op, target int }

// narrowWidths returns the widths for the rows rs: the operation column is as wide as the
// longest operation cell (at least opWidth), and what it takes beyond opWidth comes from
// the task column and then the target column, down to minWidth each.
func narrowWidths(rs []*residual.Residual) widths {
	w := widths{task: taskWidth, op: opWidth, target: targetWidth}
	for _, r := range rs {
		w.op = max(w.op, utf8.RuneCountInString(opCell(r.Operation)))
	}
	excess := w.op - opWidth
	take := min(excess, w.task-minWidth)
	w.task, excess = w.task-take, excess-take
	w.target -= min(excess, w.target-minWidth)
	return w
}

// opCell returns the operation op for the narrow table: whole when it fits opWidth; else
// without the server id of a proxy's "SERVER/TOOL" ("…/TOOL"), so the tool name is never
// cut (narrowWidths widens the column instead).
func opCell(op string) string {
	op = cell(op, 0)
	if utf8.RuneCountInString(op) <= opWidth {
		return op
	}
	if _, tool, ok := strings.Cut(op, "/"); ok && tool != "" {
		return "…/" + tool
	}
	return op
}

// writeRow writes r as a row of the ls table, after the header when header is set. short
// maps keys to their abbreviations and w gives the column widths (both unused when wide).
func writeRow(tw io.Writer, r *residual.Residual, header, wide bool, short map[string]string, w widths) {
	attempt, holder := "-", "-"
	if cur := r.Current(); cur != nil {
		attempt, holder = fmt.Sprint(cur.N), cur.Holder
	}
	if wide {
		if header {
			fmt.Fprintln(tw, "KEY\tSTATE\tTASK\tOPERATION\tTARGET\tATTEMPT\tHOLDER\tUPDATED")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Key, r.State, cell(r.Task, 0), cell(r.Operation, 0),
			cell(r.Target, 0), attempt, cell(holder, 0), r.UpdatedAt.UTC().Format(wideLayout))
		return
	}
	if header {
		fmt.Fprintln(tw, "KEY\tSTATE\tTASK\tOPERATION\tTARGET\tATTEMPT\tUPDATED UTC")
	}
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", short[r.Key], r.State, cell(r.Task, w.task), opCell(r.Operation),
		cell(r.Target, w.target), attempt, r.UpdatedAt.UTC().Format(narrowLayout))
}

// shortKeys abbreviates the keys of rs to "tf1_" and shortKeyHex hex digits, or as many more
// as it takes for no two of them to share an abbreviation.
func shortKeys(rs []*residual.Residual) map[string]string {
	for n := len(residual.KeyPrefix) + shortKeyHex; ; n++ {
		out := make(map[string]string, len(rs))
		seen := make(map[string]bool, len(rs))
		unique := true
		for _, r := range rs {
			s := r.Key[:min(n, len(r.Key))]
			unique = unique && !seen[s]
			seen[s] = true
			out[r.Key] = s
		}
		if unique {
			return out
		}
	}
}

// cell returns s for a table cell: "-" when empty, control characters (tabs and newlines
// among them) escaped by safe, and cut to width runes with a trailing … when width > 0.
func cell(s string, width int) string {
	if s == "" {
		return "-"
	}
	s = safe(s)
	if width > 0 && utf8.RuneCountInString(s) > width {
		s = string([]rune(s)[:width-1]) + "…"
	}
	return s
}
