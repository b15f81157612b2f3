package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/ledger/postgres"
)

func init() { register(newMigrateCmd) }

type migrateFlags struct {
	down     int
	status   bool
	yes      bool
	dropOpen int // --yes-drop-open; -1 when not given
}

func newMigrateCmd(a *app) *cobra.Command {
	f := migrateFlags{down: -1, dropOpen: -1}
	cmd := &cobra.Command{
		Use:   "migrate --store postgres://… [--down N --yes [--yes-drop-open N] | --status]",
		Short: "Apply (or revert) the PostgreSQL schema migrations of a store",
		Long: `Bring the schema of a PostgreSQL store to the version this binary knows, and print the
version before and after. Migrations run in one transaction under an advisory lock, so
concurrent runs (and ledgers opening the store, which migrate automatically) do not race;
a store already up to date is left untouched.

The schema is the DSN's search_path (created when missing), else the server's default.

--status prints the current version and the applied migrations, and changes nothing.
--down N reverts every migration newer than N; --down 0 removes toolfence's tables and
every residual in them: use it to uninstall. A revert can delete data, so --down needs
--yes to run. Open residuals (pending, unknown, accepted: calls in flight, or that may have
happened without a recorded outcome) are what successors need to not repeat an effect, so
--down 0 refuses while any is open, naming how many and the oldest few: resolve them first
(toolfence ls, toolfence resolve), or confirm dropping them with --yes-drop-open N, where N
must be the number open (counted again, under a lock, in the transaction that drops them).

A store migrated by a newer toolfence than this one is refused (nothing is written):
upgrade the binary. Processes check the version when they open the store, so stop every
process of the other version before migrating up or down (an older process's reserves
fail once its tables change; a newer one's would not keep its guarantees after --down).
Badger directory stores have no migrations.

Example:
  toolfence migrate --store postgres://toolfence@db:5432/toolfence
  toolfence migrate --status --store 'postgres://toolfence@db/toolfence?search_path=agents'
  toolfence migrate --down 0 --yes --store postgres://toolfence@db/toolfence
  toolfence migrate --down 0 --yes --yes-drop-open 3 --store postgres://toolfence@db/toolfence`,
		Args: args(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("yes-drop-open") {
				f.dropOpen = -1
			}
			return a.migrate(cmd.Context(), f, cmd.Flags().Changed("down"))
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.down, "down", -1, "revert the migrations newer than version N (0 removes every toolfence table)")
	fl.BoolVar(&f.status, "status", false, "print the schema version and the applied migrations; change nothing")
	fl.BoolVar(&f.yes, "yes", false, "confirm --down: revert migrations even though that can delete residuals")
	fl.IntVar(&f.dropOpen, "yes-drop-open", -1, "with --down 0: confirm dropping this many open residuals (pending, unknown, accepted); must equal the number open")
	return cmd
}

func (a *app) migrate(ctx context.Context, f migrateFlags, down bool) error {
	store := a.store
	if !isDSN(store) {
		return usagef("migrations apply only to PostgreSQL stores (--store postgres://…); %s names a badger directory store, which needs none", store)
	}
	latest := postgres.LatestVersion()
	switch {
	case down && f.status:
		return usagef("give --down N or --status, not both")
	case down && (f.down < 0 || f.down > latest):
		return usagef("--down %d: want a version from 0 to %d (the newest this binary knows)", f.down, latest)
	case down && !f.yes && f.down == 0:
		return usagef("--down 0 removes toolfence's tables and every residual in them (successors lose what was in flight); " +
			"nothing was changed: add --yes to do it")
	case down && !f.yes:
		return usagef("--down %d reverts the migrations newer than %d, which can delete data; nothing was changed: add --yes to do it", f.down, f.down)
	case f.yes && !down:
		return usagef("--yes confirms --down N; without --down it has nothing to confirm")
	case f.dropOpen != -1 && (!down || f.down != 0):
		return usagef("--yes-drop-open confirms dropping open residuals, which only --down 0 does")
	case f.dropOpen < -1:
		return usagef("--yes-drop-open %d: want the number of open residuals (0 or more)", f.dropOpen)
	}
	where := displayStore(store)
	if f.status {
		return a.migrateStatus(ctx, store, latest)
	}

	var from, to int
	var err error
	if down {
		from, to, err = postgres.MigrateDown(ctx, store, f.down, postgres.DownOptions{DropOpen: max(f.dropOpen, 0)})
	} else {
		from, to, err = postgres.Migrate(ctx, store, postgres.Options{Schema: dsnSchema(store)})
	}
	if errors.Is(err, postgres.ErrSchemaTooNew) {
		return fmt.Errorf("the schema of %s is at version %d, newer than this binary knows (up to %d): it was migrated by a newer toolfence; "+
			"upgrade toolfence (nothing was changed)", where, from, latest)
	}
	var open *postgres.OpenResidualsError
	if errors.As(err, &open) {
		return openResidualsRefused(where, open, f.dropOpen)
	}
	if err != nil {
		return fmt.Errorf("migrating %s: %w", where, err)
	}
	switch {
	case from == to && down:
		_, err = fmt.Fprintf(a.stdout, "%s: schema version %d, already at or below %d (nothing to do)\n", where, from, f.down)
	case from == to:
		_, err = fmt.Fprintf(a.stdout, "%s: schema version %d, up to date (nothing to do)\n", where, from)
	default:
		_, err = fmt.Fprintf(a.stdout, "%s: schema version %d → %d\n", where, from, to)
	}
	return err
}

// openResidualsRefused explains a --down 0 refused for open residuals and what to do.
func openResidualsRefused(where string, e *postgres.OpenResidualsError, confirmed int) error {
	if confirmed >= 0 && e.Count == 0 {
		return &explained{err: e, msg: fmt.Sprintf("--yes-drop-open %d, but %s holds no open residual now: nothing was changed; run again without --yes-drop-open",
			confirmed, where)}
	}
	if confirmed >= 0 {
		return &explained{err: e, msg: fmt.Sprintf("--yes-drop-open %d, but %s holds %d open residuals now (%s): nothing was changed; "+
			"check them again (toolfence ls) and pass the number that is open", confirmed, where, e.Count, e.List())}
	}
	return &explained{err: e, msg: fmt.Sprintf("%s holds %s (%s): calls in flight, or that may have happened without a recorded outcome; "+
		"--down 0 would drop them and a successor could repeat their effects. Nothing was changed. Resolve them first "+
		"(toolfence ls --namespace NS, then toolfence resolve KEY --as succeeded|failed --note WHY), or drop them anyway: add --yes-drop-open %d",
		where, plural(e.Count, "open residual"), e.List(), e.Count)}
}

// plural returns "1 thing" or "N things".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// migrateStatus prints the store's schema version and applied migrations; it writes nothing.
func (a *app) migrateStatus(ctx context.Context, store string, latest int) error {
	where := displayStore(store)
	rows, err := postgres.Status(ctx, store, postgres.Options{})
	if err != nil {
		return fmt.Errorf("reading the schema version of %s: %w", where, err)
	}
	current := 0
	if n := len(rows); n > 0 {
		current = rows[n-1].Version
	}
	var state string
	switch {
	case current > latest:
		state = "newer than this binary: upgrade toolfence"
	case current == latest:
		state = "up to date"
	case current == 0:
		state = fmt.Sprintf("no toolfence tables yet; %d migration(s) pending: run toolfence migrate (serve, demo and ledgers opened from Go also create it)", latest)
	default:
		state = fmt.Sprintf("%d migration(s) pending: run toolfence migrate", latest-current)
	}
	fmt.Fprintf(a.stdout, "%s: schema version %d, this binary knows up to %d: %s\n", where, current, latest, state)
	for _, m := range rows {
		fmt.Fprintf(a.stdout, "  %04d %s  applied %s\n", m.Version, m.Name, stamp(m.At))
	}
	return nil
}

var plainIdentifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// dsnSchema returns the schema the DSN's search_path names when it is one plain identifier
// (so migrate can create it), else "".
func dsnSchema(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return ""
	}
	sp := u.Query().Get("search_path")
	if uq, err := strconv.Unquote(sp); err == nil {
		sp = uq
	}
	if !plainIdentifier.MatchString(sp) {
		return ""
	}
	return sp
}
