package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one embedded schema version with its up and down SQL.
type migration struct {
	version  int
	name     string
	up, down string
}

var migrationName = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.(up|down)\.sql$`)

// loadMigrations reads the embedded migrations, ordered by version. Versions must run from
// 1 without gaps and each must have both an up and a down file.
func loadMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("postgres: read embedded migrations: %w", err)
	}
	byVersion := map[int]*migration{}
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("postgres: embedded migration %q is not named NNNN_name.up|down.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		body, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, fmt.Errorf("postgres: read migration %s: %w", e.Name(), err)
		}
		mg := byVersion[v]
		if mg == nil {
			mg = &migration{version: v, name: m[2]}
			byVersion[v] = mg
		}
		if m[3] == "up" {
			mg.up = string(body)
		} else {
			mg.down = string(body)
		}
	}
	ms := make([]migration, 0, len(byVersion))
	for _, m := range byVersion {
		ms = append(ms, *m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i, m := range ms {
		if m.version != i+1 || m.up == "" || m.down == "" {
			return nil, fmt.Errorf("postgres: embedded migration %04d_%s: versions must run 1, 2, … with an up and a down file each", m.version, m.name)
		}
	}
	if len(ms) == 0 {
		return nil, errors.New("postgres: no embedded migrations")
	}
	return ms, nil
}

// LatestVersion returns the newest schema version this binary knows.
func LatestVersion() int {
	ms, err := loadMigrations()
	if err != nil {
		return 0
	}
	return ms[len(ms)-1].version
}

// Migrate applies every pending migration to the database at dsn (in opts.Schema when set,
// creating it if missing), in one transaction under an advisory lock, and returns the
// schema version before and after. A database already at the latest version is left
// untouched (from == to). A database at a newer version than this binary knows gives an
// error wrapping ErrSchemaTooNew and nothing is written.
func Migrate(ctx context.Context, dsn string, opts Options) (from, to int, err error) {
	ms, err := loadMigrations()
	if err != nil {
		return 0, 0, err
	}
	return runMigration(ctx, dsn, opts, ms[len(ms)-1].version, false, 0, ms)
}

// MigrateDown reverts migrations newer than version to (0 removes every toolfence table and
// its data), in one transaction under the same advisory lock, and returns the version
// before and after. A database already at or below to is left untouched (from == now): it
// never migrates up. It refuses with ErrSchemaTooNew when the database is at a version this
// binary does not know (it cannot run that version's down SQL), and, going to 0, with an
// *OpenResidualsError (wrapping ErrOpenResiduals) unless the number of open residuals is
// opts.DropOpen: calls that may have happened would be forgotten.
func MigrateDown(ctx context.Context, dsn string, to int, opts DownOptions) (from, now int, err error) {
	ms, err := loadMigrations()
	if err != nil {
		return 0, 0, err
	}
	if to < 0 || to > ms[len(ms)-1].version {
		return 0, 0, fmt.Errorf("postgres: migrate down to %d: want a version from 0 to %d", to, ms[len(ms)-1].version)
	}
	return runMigration(ctx, dsn, opts.Options, to, true, opts.DropOpen, ms)
}

func runMigration(ctx context.Context, dsn string, opts Options, target int, down bool, dropOpen int, ms []migration) (int, int, error) {
	cfg, err := poolConfig(dsn, opts)
	if err != nil {
		return 0, 0, err
	}
	conn, err := connect(ctx, cfg.ConnConfig)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return migrateConn(ctx, conn, cfg.ConnConfig, opts.Schema, target, down, dropOpen, ms)
}

const versionTable = "toolfence_schema_migrations"

// Applied is a migration recorded in a store's schema.
type Applied struct {
	Version int
	Name    string
	At      time.Time
}

// Status returns the migrations applied to the schema of the store at dsn (opts.Schema when
// set, else the DSN's search_path), oldest first; none when toolfence has no tables there.
// It writes nothing. It fails with an error wrapping ErrInvalidDSN or ledger.ErrUnavailable, or
// with the server's error naming the store.
func Status(ctx context.Context, dsn string, opts Options) ([]Applied, error) {
	cfg, err := poolConfig(dsn, opts)
	if err != nil {
		return nil, err
	}
	conn, err := connect(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('`+versionTable+`') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		return nil, wrapRead(cfg.ConnConfig, err)
	}
	rows, err := conn.Query(ctx, `SELECT version, name, applied_at FROM `+versionTable+` ORDER BY version`)
	if err != nil {
		return nil, wrapRead(cfg.ConnConfig, err)
	}
	applied, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Applied, error) {
		var m Applied
		return m, row.Scan(&m.Version, &m.Name, &m.At)
	})
	return applied, wrapRead(cfg.ConnConfig, err)
}

// wrapRead names the store in a failed read of its schema version; nil stays nil.
func wrapRead(cc *pgx.ConnConfig, err error) error {
	if err == nil {
		return nil
	}
	if isConnError(err) {
		return unavailable(cc, err)
	}
	return fmt.Errorf("postgres: read the schema version of %s: %w", describe(cc), err)
}

// currentVersion returns the highest applied migration, or 0 when the version table does
// not exist in the connection's schema.
func currentVersion(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (int, error) {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('`+versionTable+`') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		return 0, err
	}
	var v int
	err := q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+versionTable).Scan(&v)
	return v, err
}

// migrateLockKey is the first half of the advisory lock key; the second is the hash of the
// schema name, so migrations of different schemas do not wait for each other.
const migrateLockKey = 0x7466_6d67 // "tfmg"

// migrateConn moves the schema of conn to version target in one transaction: up to it
// (creating schema, when not empty, first), or with down only down to it. A schema that is
// already there, or past it in the other direction, is left untouched. Down to 0 it first
// checks the open residuals (checkOpenBeforeDrop; dropOpen is how many may go).
func migrateConn(ctx context.Context, conn *pgx.Conn, cc *pgx.ConnConfig, schema string, target int, down bool, dropOpen int, ms []migration) (from, to int, err error) {
	where := describe(cc)
	latest := ms[len(ms)-1].version
	// done reports that a schema at version v needs nothing in this direction (a schema
	// past the newest version is refused under the lock below).
	done := func(v int) bool { return v == target || down && v < target }
	// Fast path: nothing to do needs no lock and no write.
	if v, err := currentVersion(ctx, conn); err == nil && done(v) {
		return v, v, nil
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, 0, unavailable(cc, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, migrateLockKey, cc.RuntimeParams["search_path"]); err != nil {
		return 0, 0, fmt.Errorf("postgres: migrate %s: take the migration lock: %w", where, err)
	}
	from, err = currentVersion(ctx, tx)
	if err != nil {
		return 0, 0, fmt.Errorf("postgres: migrate %s: read the schema version: %w", where, err)
	}
	if from > latest {
		return from, from, fmt.Errorf("%w: %s is at migration %d, this binary knows up to %d; upgrade toolfence", ErrSchemaTooNew, where, from, latest)
	}
	if done(from) {
		return from, from, nil
	}
	if from < target {
		var missing bool
		if err := tx.QueryRow(ctx, `SELECT current_schema() IS NULL`).Scan(&missing); err != nil {
			return from, from, fmt.Errorf("postgres: migrate %s: %w", where, err)
		}
		switch {
		case missing && schema == "":
			return from, from, fmt.Errorf("%w: %s: no schema of search_path %q exists: toolfence migrate creates the schema a DSN's search_path names (from Go: set Options.Schema)",
				ErrNoStore, where, cc.RuntimeParams["search_path"])
		case missing:
			if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
				return from, from, fmt.Errorf("postgres: migrate %s: create schema %s: %w", where, schema, err)
			}
		}
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+versionTable+` (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return from, from, fmt.Errorf("postgres: migrate %s: create %s: %w", where, versionTable, err)
	}
	for _, m := range ms {
		if m.version > from && m.version <= target {
			if _, err := tx.Exec(ctx, m.up); err != nil {
				return from, from, fmt.Errorf("postgres: migrate %s: %04d_%s up: %w", where, m.version, m.name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+versionTable+` (version, name) VALUES ($1, $2) ON CONFLICT DO NOTHING`, m.version, m.name); err != nil {
				return from, from, fmt.Errorf("postgres: migrate %s: record %04d: %w", where, m.version, err)
			}
		}
	}
	if down && target == 0 {
		if err := checkOpenBeforeDrop(ctx, tx, where, dropOpen); err != nil {
			return from, from, err
		}
	}
	for i := len(ms) - 1; i >= 0; i-- {
		if m := ms[i]; m.version <= from && m.version > target {
			if _, err := tx.Exec(ctx, m.down); err != nil {
				return from, from, fmt.Errorf("postgres: migrate %s: %04d_%s down: %w", where, m.version, m.name, err)
			}
			if _, err := tx.Exec(ctx, `DELETE FROM `+versionTable+` WHERE version = $1`, m.version); err != nil {
				return from, from, fmt.Errorf("postgres: migrate %s: unrecord %04d: %w", where, m.version, err)
			}
		}
	}
	if target == 0 {
		if _, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+versionTable); err != nil {
			return from, from, fmt.Errorf("postgres: migrate %s: drop %s: %w", where, versionTable, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return from, from, fmt.Errorf("postgres: migrate %s: commit: %w", where, err)
	}
	return from, target, nil
}
