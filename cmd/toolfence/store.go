package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/ledger/remote"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/residual"
)

// serverEnv names the environment variable that sets the default of --server.
const serverEnv = "TOOLFENCE_SERVER"

// remoteTimeout bounds each request to a --server.
const remoteTimeout = 30 * time.Second

// isDSN reports whether store names a PostgreSQL database rather than a badger directory.
func isDSN(store string) bool {
	return strings.HasPrefix(store, "postgres://") || strings.HasPrefix(store, "postgresql://")
}

// urlLike matches a value that starts like a URL (a scheme of two or more characters and a
// colon: "postgres:/…", "http://…"), which a badger directory path rarely does.
var urlLike = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]+:`)

// badgerMarker is a file every badger directory store holds (badger's manifest); a
// directory without it is not a store.
const badgerMarker = "MANIFEST"

// storeOptions say how openStore opens a store.
type storeOptions struct {
	// mustExist refuses a badger directory that is not a store yet and a PostgreSQL schema
	// without toolfence tables, instead of creating them.
	mustExist bool
	// token is the bearer token for an http(s):// store.
	token string
	// namespace is checked against the token of an http(s):// store when it is opened.
	namespace string
	// minFree is badger.Options.MinFree for the owner of a badger store: it refuses new
	// reservations while the store's filesystem has less free space (0: the default).
	minFree uint64
	// allowAsyncReplicas opens a PostgreSQL store whose standbys are all asynchronous
	// (postgres.Options.AllowAsyncReplicas), warning on log.
	allowAsyncReplicas bool
	log                *slog.Logger
}

// ownerSocket is the unix socket, inside a badger store's directory, on which the process
// that holds the store serves it to the other toolfence processes.
const ownerSocket = "toolfence.sock"

// storeWaitEnv names the environment variable that bounds how long a process waits for the
// holder of a badger store to answer on its socket (a Go duration; default 10s).
const storeWaitEnv = "TOOLFENCE_STORE_WAIT"

// openStore opens the ledger named by store: PostgreSQL for a postgres:// or postgresql://
// DSN (migrated, or with mustExist refused when its schema has no toolfence tables), a
// toolfence server for an http:// or https:// URL (`toolfence serve --http`, reached with
// the bearer token; checked now, so a wrong token or namespace fails here), otherwise the
// badger directory store. It is the one place the binary opens ledgers, and it creates
// nothing it should not: a value that looks like a URL but is none of these is a usage
// error (a mistyped DSN never becomes a local directory); an existing directory that is
// neither empty nor a store is refused; with mustExist a directory that is not a store yet
// is refused instead of being created.
//
// A badger store is shared: the first process to open it owns it and serves it on
// DIR/toolfence.sock (mode 0600); a process that finds it held goes through that socket
// (remote.Shared), and takes the store over when its owner goes away. A store held by a
// process that serves no socket gives an error that says so (and wraps badger.ErrLocked).
func openStore(ctx context.Context, store string, o storeOptions) (ledger.Ledger, error) {
	if store == "" {
		return nil, usagef("--store is empty: name a badger directory, a postgres:// DSN or an http(s):// toolfence server")
	}
	if isDSN(store) {
		return openPostgres(ctx, store, o)
	}
	if isServerURL(store) {
		return openServer(ctx, store, o)
	}
	if err := checkStoreDir(store, o.mustExist); err != nil {
		return nil, err
	}
	wait, err := storeWait()
	if err != nil {
		return nil, err
	}
	l, err := remote.OpenShared(ctx, remote.SharedOptions{
		Socket: filepath.Join(store, ownerSocket),
		Open: func() (ledger.Ledger, error) {
			return badger.Open(store, badger.Options{MinFree: o.minFree})
		},
		Locked: func(err error) bool { return errors.Is(err, badger.ErrLocked) },
		Wait:   wait,
	})
	if errors.Is(err, badger.ErrLocked) {
		return nil, &lockedError{store: store, err: err, wait: wait}
	}
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", store, err)
	}
	return l, nil
}

// openExclusive opens the badger store in dir for this process alone (no socket, nobody
// else): a store held by another process gives an error that says so.
func openExclusive(dir string) (ledger.Ledger, error) {
	if err := checkStoreDir(dir, false); err != nil {
		return nil, err
	}
	l, err := badger.Open(dir, badger.Options{})
	if errors.Is(err, badger.ErrLocked) {
		return nil, &lockedError{store: dir, err: err, exclusive: true}
	}
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", dir, err)
	}
	return l, nil
}

// storeWait reads $TOOLFENCE_STORE_WAIT.
func storeWait() (time.Duration, error) {
	v := strings.TrimSpace(os.Getenv(storeWaitEnv))
	if v == "" {
		return remote.DefaultWait, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, usagef("$%s=%q: want a positive Go duration like 10s", storeWaitEnv, v)
	}
	return d, nil
}

// isServerURL reports whether store names a toolfence server (http:// or https://).
func isServerURL(store string) bool {
	return strings.HasPrefix(store, "http://") || strings.HasPrefix(store, "https://")
}

// openServer opens the ledger served by `toolfence serve --http` at url, and checks with one
// read that the server answers the protocol and takes the token for the namespace.
func openServer(ctx context.Context, url string, o storeOptions) (ledger.Ledger, error) {
	c, err := remote.New(url, remote.Options{Token: o.token, Timeout: remoteTimeout})
	if err != nil {
		return nil, usagef("--store: %v", err)
	}
	ns := o.namespace
	_, err = c.Get(ctx, ledger.GetParams{Namespace: ns, Key: residual.Key(ns, "toolfence-probe", "probe", "probe")})
	if err == nil || errors.Is(err, residual.ErrNotFound) {
		return c, nil
	}
	c.Close()
	where := c.Endpoint()
	switch {
	case errors.Is(err, ledger.ErrUnauthorized) && o.token == "":
		return nil, &explained{err: err, msg: fmt.Sprintf(
			"server %s refused the request (401 Unauthorized): it needs a bearer token: give --token, --token-file or $%s", where, tokenEnv)}
	case errors.Is(err, ledger.ErrUnauthorized):
		return nil, &explained{err: err, msg: fmt.Sprintf(
			"server %s refused the bearer token (401 Unauthorized): check --token, --token-file or $%s against the server's token file", where, tokenEnv)}
	case errors.Is(err, remote.ErrNotGranted):
		return nil, &explained{err: err, msg: fmt.Sprintf(
			"server %s serves this bearer token MCP only (403): a token for --store http://… needs the ledger grant, "+
				"a line \"TOKEN NAMESPACE ledger\" in the server's --token-file", where)}
	case errors.Is(err, ledger.ErrForbidden):
		return nil, &explained{err: err, msg: fmt.Sprintf(
			"server %s refused namespace %q (403): %v; pass the namespace of your token with --namespace", where, ns, messageOf(err))}
	case errors.Is(err, ledger.ErrUnavailable), errors.Is(err, remote.ErrConnectionLost):
		return nil, fmt.Errorf("cannot reach the toolfence server at %s (is `toolfence serve --http` running there?): %w", where, err)
	case errors.Is(err, remote.ErrProtocol):
		return nil, fmt.Errorf("%s does not serve the toolfence ledger at %s (is it `toolfence serve --http`, of this version or newer?): %w", where, remote.Path, err)
	}
	return nil, fmt.Errorf("opening store %s: %w", where, err)
}

// messageOf returns the server's own text of a remote error.
func messageOf(err error) string {
	var re *remote.Error
	if errors.As(err, &re) {
		return re.Message
	}
	return err.Error()
}

// maskUserinfo returns s with whatever stands between its scheme and its last '@' (where a
// user and password would be) replaced by "…", for messages about a value that is not a
// well-formed URL.
func maskUserinfo(s string) string {
	i, j := strings.Index(s, ":"), strings.LastIndex(s, "@")
	if i < 0 || j < i {
		return s
	}
	return s[:i+1] + "…" + s[j:]
}

// checkStoreDir returns nil when dir may be opened as a badger store: it is a store already
// (it holds badger's manifest), or, unless mustExist, it is missing or an empty directory
// (badger creates the store there). Anything else is an error that says what dir is and
// writes nothing.
func checkStoreDir(dir string, mustExist bool) error {
	if urlLike.MatchString(dir) {
		return usagef("--store %q looks like a URL but is not a PostgreSQL DSN: write postgres://USER@HOST/DB "+
			"(two slashes) or http(s)://HOST:PORT for a toolfence server, or start a directory's path with ./ when its name has a colon", maskUserinfo(dir))
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist) && mustExist:
		return fmt.Errorf("no store at %s: nothing has been recorded there (set --store or $%s)", dir, storeEnv)
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("opening store %s: %w", dir, err)
	case !fi.IsDir():
		return fmt.Errorf("--store %s is a file, not a store: name a directory (a badger store) or a postgres:// DSN", dir)
	}
	if _, err := os.Stat(filepath.Join(dir, badgerMarker)); err == nil {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("opening store %s: %w", dir, err)
	}
	if len(entries) > 0 && !storeInTheMaking(entries) {
		return fmt.Errorf("%s is a directory with other files in it, not a toolfence store (it holds no badger %s); "+
			"name a new or empty directory, or the store itself", dir, badgerMarker)
	}
	if mustExist {
		return fmt.Errorf("no store at %s: the directory is empty, nothing has been recorded there (set --store or $%s)", dir, storeEnv)
	}
	return nil
}

// storeInTheMaking reports whether a directory without badger's manifest holds only files
// badger writes (its LOCK, the manifest being written, key registry, logs, tables) and our
// socket: another process is creating the store right now, so this one may open it (and
// then goes through that process).
func storeInTheMaking(entries []os.DirEntry) bool {
	for _, e := range entries {
		switch n := e.Name(); {
		case n == "LOCK", n == "DISCARD", strings.HasPrefix(n, "MANIFEST"), strings.Contains(n, "KEYREGISTRY"),
			strings.HasSuffix(n, ".vlog"), strings.HasSuffix(n, ".mem"), strings.HasSuffix(n, ".sst"),
			strings.HasPrefix(n, ownerSocket):
		default:
			return false
		}
	}
	return true
}

// openPostgres opens the PostgreSQL ledger at dsn, applying pending migrations; with
// mustExist a schema without toolfence tables is an error (nothing is created). A server
// that can lose acknowledged writes is refused (postgres.ErrNotDurable), and so is one
// whose standbys are all asynchronous unless allowAsyncReplicas (postgres.ErrAsyncReplicas).
// Its errors name the server, never the password.
func openPostgres(ctx context.Context, dsn string, o storeOptions) (ledger.Ledger, error) {
	l, err := postgres.Open(ctx, dsn, postgres.Options{MustExist: o.mustExist, AllowAsyncReplicas: o.allowAsyncReplicas, Logger: o.log})
	if errors.Is(err, postgres.ErrAsyncReplicas) {
		return nil, fmt.Errorf("opening store %s: %w (--%s allows it)", displayStore(dsn), err, allowAsyncFlag)
	}
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", displayStore(dsn), err)
	}
	return l, nil
}

// lockedError says that another process holds a badger store and does not share it (or,
// exclusive, that a command needing the store alone found it held); it wraps
// badger.ErrLocked.
type lockedError struct {
	store     string
	err       error
	wait      time.Duration
	exclusive bool
}

func (e *lockedError) Error() string {
	if e.exclusive {
		return "store " + e.store + " is in use by another process, and this command needs it alone (stop the other process, or use another --store)"
	}
	return fmt.Sprintf("store %s is in use by another process that does not share it: nothing answered on %s within %v "+
		"(an older toolfence, or a program that opened the store itself; $%s sets the wait)",
		e.store, filepath.Join(e.store, ownerSocket), e.wait, storeWaitEnv)
}

func (e *lockedError) Unwrap() error { return e.err }

// allowAsyncFlag is the flag of the commands that open a store to accept a PostgreSQL
// server whose standbys are all asynchronous.
const allowAsyncFlag = "allow-async-replicas"

// postgresFlags adds --allow-async-replicas to a command that opens --store.
func (a *app) postgresFlags(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&a.allowAsyncReplicas, allowAsyncFlag, false,
		"open a PostgreSQL --store whose standbys are all asynchronous (a failover can lose acknowledged writes; a warning is logged); see docs/postgres.md")
}

// tokenFlags adds --token and --token-file to a command that can open an http(s):// store
// but has no --server.
func (a *app) tokenFlags(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&a.token, "token", "", "bearer token for an http(s):// --store (default $"+tokenEnv+")")
	fl.StringVar(&a.tokenFile, "token-file", "", "file holding the bearer token for an http(s):// --store (one token, mode 600)")
}

// serverFlags adds --server, --token and --token-file to a command that can act through a
// running `toolfence serve --http`.
func (a *app) serverFlags(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&a.server, "server", os.Getenv(serverEnv),
		"act through a running toolfence serve --http at this URL (http://HOST:PORT) instead of opening --store; $"+serverEnv+" sets the default")
	fl.StringVar(&a.token, "token", "", "bearer token for --server or an http(s):// --store (default $"+tokenEnv+")")
	fl.StringVar(&a.tokenFile, "token-file", "", "file holding the bearer token for --server or an http(s):// --store (one token, mode 600)")
}

// records is where ls, show and resolve read and settle residuals: a ledger opened from
// --store, or a toolfence server reached through --server. Both return residuals whole and
// errors that match the residual sentinels (residual.ErrNotFound, ErrInProgress,
// ErrInvalidTransition).
type records interface {
	// list returns one page. The namespace of p applies to a store only; a server lists
	// the namespace of its token.
	list(ctx context.Context, p ledger.ListParams) (*ledger.Page, error)
	// keys returns one page of keys, from cursor ("" for the first), and the cursor of the
	// next page ("" after the last): every key of the namespace from a store, the keys of
	// open residuals from a server.
	keys(ctx context.Context, cursor string) (keys []string, next string, err error)
	get(ctx context.Context, key string) (*residual.Residual, error)
	resolve(ctx context.Context, p ledger.ResolveParams) (*residual.Residual, error)
	// where names the namespace and the store or server, for messages.
	where() string
	Close() error
}

// records opens what --server or --store names. With --server, --store and --namespace
// must not be set (the server owns the store, and its token decides the namespace); an
// explicit --store overrides a server that only $TOOLFENCE_SERVER names.
func (a *app) records(cmd *cobra.Command) (records, error) {
	ctx := cmd.Context()
	if !a.viaServer(cmd) {
		if (a.token != "" || a.tokenFile != "") && !isServerURL(a.store) {
			return nil, usagef("--token and --token-file go with --server URL (or $%s) or an http(s):// --store", serverEnv)
		}
		l, err := a.open(ctx, true)
		if err != nil {
			return nil, err
		}
		return &local{l: l, ns: a.namespace, store: a.store}, nil
	}
	for _, name := range []string{"store", "namespace"} {
		if cmd.Flags().Changed(name) {
			return nil, usagef("--%s does not go with --server: the server owns its store, and your token decides the namespace", name)
		}
	}
	c, err := a.dial(ctx)
	if err != nil {
		return nil, err
	}
	return &mcpRecords{c: c, url: a.server}, nil
}

// viaServer reports whether the command acts through --server: it is set, by the flag or
// by $TOOLFENCE_SERVER, and an explicit --store does not override the environment.
func (a *app) viaServer(cmd *cobra.Command) bool {
	if !cmd.Flags().Changed("server") && cmd.Flags().Changed("store") {
		a.server = ""
	}
	return a.server != ""
}

// bearerToken returns the token of --token, else of --token-file, else $TOOLFENCE_TOKEN;
// "" when none is set.
func (a *app) bearerToken() (string, error) {
	switch {
	case a.token != "" && a.tokenFile != "":
		return "", usagef("give --token or --token-file, not both")
	case a.token != "":
		return a.token, nil
	case a.tokenFile != "":
		return readTokenFile(a.tokenFile)
	}
	return strings.TrimSpace(os.Getenv(tokenEnv)), nil
}

// readTokenFile reads one bearer token from path: the first field of its only line that is
// neither blank nor a '#' comment (so a one-token file of `toolfence serve --token-file`,
// "TOKEN NAMESPACE", works too). Like the server, it refuses a file other users may read.
func readTokenFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", usagef("--token-file: %v", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", usagef("--token-file %s has mode %v: other users may read it; chmod 600 it", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", usagef("--token-file: %v", err)
	}
	var tokens []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
			tokens = append(tokens, f[0])
		}
	}
	if len(tokens) != 1 {
		return "", usagef("--token-file %s holds %d tokens, want exactly 1 (the first word of its only line)", path, len(tokens))
	}
	return tokens[0], nil
}

// dial connects to --server with the bearer token. A refused token is an error that says
// 401 and where the token came from.
func (a *app) dial(ctx context.Context) (*mcpserver.Client, error) {
	token, err := a.bearerToken()
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, remoteTimeout)
	defer cancel()
	c, err := mcpserver.Dial(dctx, a.server, token)
	switch {
	case errors.Is(err, ledger.ErrUnauthorized) && token == "":
		return nil, &explained{err: err, msg: fmt.Sprintf(
			"server %s refused the request (401 Unauthorized): it needs a bearer token: give --token, --token-file or $%s", a.server, tokenEnv)}
	case errors.Is(err, ledger.ErrUnauthorized):
		return nil, &explained{err: err, msg: fmt.Sprintf(
			"server %s refused the bearer token (401 Unauthorized): check --token, --token-file or $%s against the server's token file", a.server, tokenEnv)}
	case err != nil:
		return nil, fmt.Errorf("cannot reach the toolfence server at %s (is `toolfence serve --http` running there?): %w", a.server, err)
	}
	return c, nil
}

// explained is an error whose message replaces its cause's text; errors.Is and As still
// see the cause.
type explained struct {
	msg string
	err error
}

func (e *explained) Error() string { return e.msg }
func (e *explained) Unwrap() error { return e.err }

// local is records over an opened ledger.
type local struct {
	l     ledger.Ledger
	ns    string
	store string
}

func (r *local) list(ctx context.Context, p ledger.ListParams) (*ledger.Page, error) {
	p.Namespace = r.ns
	return r.l.List(ctx, p)
}

func (r *local) keys(ctx context.Context, cursor string) ([]string, string, error) {
	page, err := r.list(ctx, ledger.ListParams{Limit: ledger.MaxListLimit, Cursor: cursor})
	if err != nil {
		return nil, "", err
	}
	keys := make([]string, 0, len(page.Residuals))
	for _, res := range page.Residuals {
		keys = append(keys, res.Key)
	}
	return keys, page.NextCursor, nil
}

func (r *local) get(ctx context.Context, key string) (*residual.Residual, error) {
	return r.l.Get(ctx, ledger.GetParams{Namespace: r.ns, Key: key})
}

// resolve settles through the interceptor, so a --result is stored the way every result
// is: redacted, then capped at the interceptor's result cap.
func (r *local) resolve(ctx context.Context, p ledger.ResolveParams) (*residual.Residual, error) {
	ic, err := interceptor.New(r.l, interceptor.Options{Namespace: r.ns})
	if err != nil {
		return nil, err
	}
	return ic.Resolve(ctx, interceptor.ResolveParams{Key: p.Key, As: p.As, By: p.By, Note: p.Note, Evidence: p.Evidence, Result: p.Result})
}

func (r *local) where() string {
	return "namespace " + r.ns + " of store " + displayStore(r.store)
}

func (r *local) Close() error { return r.l.Close() }

// mcpRecords is records through a toolfence MCP server: list_pending, inspect_residual and
// resolve_residual.
type mcpRecords struct {
	c   *mcpserver.Client
	url string
}

// list lists open residuals only (list_pending): at most one state, and an open one; the
// caller checks. Each row is read whole with inspect_residual, so the output is the same as
// from a store; a row settled and collected in between is left out.
func (r *mcpRecords) list(ctx context.Context, p ledger.ListParams) (*ledger.Page, error) {
	ctx, cancel := context.WithTimeout(ctx, remoteTimeout)
	defer cancel()
	in := mcpserver.ListPendingInput{Task: p.Task, Operation: p.Operation, Target: p.Target, Limit: p.Limit, Cursor: p.Cursor}
	switch len(p.States) {
	case 0:
	case 1:
		in.State = p.States[0].String()
	default:
		return nil, fmt.Errorf("a server lists one state at a time, got %v", p.States)
	}
	page, err := r.c.List(ctx, in)
	if err != nil {
		return nil, err
	}
	out := &ledger.Page{NextCursor: page.NextCursor}
	for _, s := range page.Residuals {
		v, err := r.c.Inspect(ctx, s.Key)
		if errors.Is(err, residual.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out.Residuals = append(out.Residuals, fromView(v))
	}
	return out, nil
}

func (r *mcpRecords) keys(ctx context.Context, cursor string) ([]string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, remoteTimeout)
	defer cancel()
	page, err := r.c.List(ctx, mcpserver.ListPendingInput{Limit: ledger.MaxListLimit, Cursor: cursor})
	if err != nil {
		return nil, "", err
	}
	keys := make([]string, 0, len(page.Residuals))
	for _, s := range page.Residuals {
		keys = append(keys, s.Key)
	}
	return keys, page.NextCursor, nil
}

func (r *mcpRecords) get(ctx context.Context, key string) (*residual.Residual, error) {
	ctx, cancel := context.WithTimeout(ctx, remoteTimeout)
	defer cancel()
	v, err := r.c.Inspect(ctx, key)
	if err != nil {
		return nil, err
	}
	return fromView(v), nil
}

func (r *mcpRecords) resolve(ctx context.Context, p ledger.ResolveParams) (*residual.Residual, error) {
	ctx, cancel := context.WithTimeout(ctx, remoteTimeout)
	defer cancel()
	_, err := r.c.Resolve(ctx, mcpserver.ResolveInput{
		Key: p.Key, As: p.As.String(), Note: p.Note, Result: p.Result, Evidence: p.Evidence, By: p.By,
	})
	if err != nil {
		return nil, err
	}
	v, err := r.c.Inspect(ctx, p.Key)
	if err != nil {
		return nil, fmt.Errorf("resolved, but reading it back failed: %w", err)
	}
	return fromView(v), nil
}

func (r *mcpRecords) where() string { return "the namespace of your token on server " + r.url }

func (r *mcpRecords) Close() error { return r.c.Close() }

// fromView turns what inspect_residual returns back into the record a store holds. Results
// are JSON values on the wire: a result that was not JSON comes back as a JSON string.
func fromView(v *mcpserver.ResidualView) *residual.Residual {
	r := &residual.Residual{
		Key: v.Key, Namespace: v.Namespace, Task: v.Task, Operation: v.Operation, Target: v.Target,
		State: v.State, RequestDigest: v.RequestDigest, Attempts: v.Attempts, AttemptCount: v.AttemptCount, ResultDigest: v.ResultDigest,
		ResultTruncated: v.ResultTruncated, Handle: v.Handle, Resolutions: v.Resolutions, Token: v.Token,
		CreatedAt: v.CreatedAt, UpdatedAt: v.UpdatedAt,
	}
	if len(v.Result) > 0 {
		r.Result = []byte(v.Result)
	}
	for _, e := range v.Evidence {
		ev := residual.Evidence{
			At: e.At, Holder: e.Holder, Token: e.Token, Outcome: e.Outcome, ResponseDigest: e.ResponseDigest,
			Handle: e.Handle, Note: e.Note, WriteID: e.WriteID,
		}
		if len(e.Result) > 0 {
			ev.Result = []byte(e.Result)
		}
		r.Evidence = append(r.Evidence, ev)
	}
	return r
}
