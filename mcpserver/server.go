package mcpserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/httpserve"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/mcpwire"
)

// Defaults of Options.
const (
	// DefaultMaxLease caps lease_ms.
	DefaultMaxLease = time.Hour
	// DefaultMaxField caps task, operation, target, handle, note and other strings.
	DefaultMaxField = 4 << 10
	// DefaultPageSize is the page of resources/list, toolfence://pending and reconcile.
	DefaultPageSize = 500
)

// Options configures a Server. Every field has a useful zero value. The barrier's own
// settings (lease length, margin, clock, argument and result caps, redaction, operation
// policies) are the interceptor's: see interceptor.Options; the server adds only the limits
// of its network surface.
type Options struct {
	// Tokens maps bearer tokens to namespaces for the HTTP transport. Defaults to none:
	// then HTTP is served only on a loopback address, without authentication, in the
	// namespace of the interceptor given to New.
	Tokens mcpwire.Tokens
	// Operations holds per-operation policies (probes, classifiers, upstream idempotency):
	// New registers them on the interceptor it is given, whose policies every namespace
	// shares. Defaults to none.
	Operations map[string]interceptor.Operation
	// NewInterceptor builds the interceptor of a namespace other than the one of the
	// interceptor given to New. Defaults to that interceptor's ForNamespace: the same
	// ledger, settings and operation policies.
	NewInterceptor func(namespace string) (*interceptor.Interceptor, error)
	// MaxLease caps lease_ms. Defaults to one hour.
	MaxLease time.Duration
	// MaxField caps every other string input in bytes. Defaults to 4 KiB.
	MaxField int
	// HTTPStateless serves protocol versions up to 2025-11-25 without sessions (no
	// Mcp-Session-Id, no server-to-client stream). Defaults to false: those clients get
	// sessions. Clients on the stateless 2026-07-28 protocol are served either way.
	HTTPStateless bool
	// SessionIdle ends a legacy HTTP session (protocol versions up to 2025-11-25) that has
	// had no request for this long and none in flight (an open notification stream is a
	// request in flight); its client gets 404 and initializes anew. Defaults to 30 minutes.
	SessionIdle time.Duration
	// MaxSessions caps the legacy HTTP sessions one token holds at once: initializing one
	// more ends the token's least recently used idle session, or gets 429 when every one
	// has a request in flight. Defaults to 64.
	MaxSessions int
	// PageSize is the most entries one answer of resources/list, the toolfence://pending
	// resource and reconcile without a key holds; each says when more remain (a cursor).
	// tools/list and prompts/list page by it too (they hold 7 tools and 1 prompt, so keep it
	// above 7 for hosts that read only the first page). Defaults to 500, at most
	// ledger.MaxListLimit.
	PageSize int
	// MaxDepth caps how deeply an HTTP request's JSON nests; deeper ones get 400 before
	// anything is decoded. Defaults to 64.
	MaxDepth int
	// MaxValues caps the objects, arrays and elements in one HTTP request's JSON (each
	// '{', '[' and ',' outside strings counts one); more get 400 before anything is
	// decoded. Defaults to 20,000.
	MaxValues int
	// MaxInFlight caps the HTTP requests one token has in progress at once (notification
	// streams, GET, do not count); more get 429 with Retry-After. Defaults to 16.
	MaxInFlight int
	// MaxInFlightTotal caps the HTTP requests in progress at once over all tokens; more get
	// 429 with Retry-After. Defaults to 32.
	MaxInFlightTotal int
	// MaxConns caps the HTTP connections ListenAndServe holds open at once (idle keep-alive
	// ones included); more wait in the kernel's accept queue. Defaults to 1024.
	MaxConns int
	// MaxConnsPerPeer caps the HTTP connections one peer address holds at once; more are
	// closed when accepted, so one peer cannot take every connection. Defaults to the
	// smaller of 256 and MaxConns.
	MaxConnsPerPeer int
	// IdleTimeout closes an HTTP keep-alive connection that sends no request for this long.
	// Defaults to one minute.
	IdleTimeout time.Duration
	// ReadHeaderTimeout bounds reading an HTTP request's headers. Defaults to 10 seconds.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading an HTTP request, headers and body. It never ends a
	// notification stream: nothing bounds writing a response. Defaults to 30 seconds.
	ReadTimeout time.Duration
	// Version is reported to clients. Defaults to "dev".
	Version string
	// Logger receives transport and watcher errors. Defaults to slog.Default().
	Logger *slog.Logger
	// Handlers are served by ListenAndServe beside Path, each at its http.ServeMux
	// pattern (the ledger protocol of ledger/remote at "/ledger/v1/"). They do their own
	// authentication; the connection limits and timeouts of ListenAndServe apply to them,
	// the per-token in-flight and session limits do not. Defaults to none.
	Handlers map[string]http.Handler
}

// invalidOptions is the error of unusable settings: "mcpserver: invalid options: " and the
// detail, wrapping interceptor.ErrInvalidOptions.
func invalidOptions(format string, args ...any) error {
	return interceptor.InvalidOptions("mcpserver: invalid options", format, args...)
}

func (o *Options) normalize(cfg interceptor.Options) error {
	o.MaxLease = cmp.Or(o.MaxLease, DefaultMaxLease)
	o.MaxField = cmp.Or(o.MaxField, DefaultMaxField)
	o.Version = cmp.Or(o.Version, "dev")
	o.SessionIdle = cmp.Or(o.SessionIdle, mcpwire.DefaultSessionIdle)
	o.MaxSessions = cmp.Or(o.MaxSessions, mcpwire.DefaultMaxSessions)
	o.MaxDepth = cmp.Or(o.MaxDepth, mcpwire.DefaultMaxDepth)
	o.PageSize = cmp.Or(o.PageSize, DefaultPageSize)
	o.MaxValues = cmp.Or(o.MaxValues, mcpwire.DefaultMaxValues)
	o.MaxInFlight = cmp.Or(o.MaxInFlight, mcpwire.DefaultMaxInFlight)
	o.MaxInFlightTotal = cmp.Or(o.MaxInFlightTotal, mcpwire.DefaultMaxInFlightTotal)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	bad := func(format string, args ...any) error {
		return invalidOptions(format, args...)
	}
	if err := o.httpLimits().Validate(); err != nil {
		return bad("%v", err)
	}
	switch {
	case o.MaxLease < cfg.LeaseTTL:
		return bad("MaxLease %v is shorter than the interceptor's lease %v", o.MaxLease, cfg.LeaseTTL)
	case o.MaxLease > ledger.MaxLease:
		return bad("MaxLease %v exceeds the longest lease a ledger grants, %v", o.MaxLease, ledger.MaxLease)
	case o.MaxField > ledger.MaxField:
		return bad("MaxField %d exceeds the ledger's bound on a field, %d", o.MaxField, ledger.MaxField)
	case o.MaxField < 0:
		return bad("MaxField %d is negative", o.MaxField)
	case o.SessionIdle < 0:
		return bad("SessionIdle %v is negative", o.SessionIdle)
	case o.PageSize < 0 || o.PageSize > ledger.MaxListLimit:
		return bad("PageSize %d: want 1 to %d", o.PageSize, ledger.MaxListLimit)
	case o.MaxSessions < 0:
		return bad("MaxSessions %d is negative", o.MaxSessions)
	case o.MaxDepth < 0 || o.MaxValues < 0 || o.MaxInFlight < 0 || o.MaxInFlightTotal < 0:
		return bad("MaxDepth, MaxValues, MaxInFlight and MaxInFlightTotal must not be negative")
	}
	// Tokens holds no empty namespace: mcpwire.Tokens.Add refuses one.
	return nil
}

// httpLimits are the limits of ListenAndServe's http.Server.
func (o *Options) httpLimits() httpserve.Limits {
	return httpserve.Limits{
		MaxConns: o.MaxConns, MaxConnsPerPeer: o.MaxConnsPerPeer, IdleTimeout: o.IdleTimeout,
		ReadHeaderTimeout: o.ReadHeaderTimeout, ReadTimeout: o.ReadTimeout,
	}
}

// Server serves the toolfence tools, resources and prompt over MCP, one MCP server per
// namespace, all on one ledger. It is safe for concurrent use; Close stops its goroutines.
type Server struct {
	base   *interceptor.Interceptor
	ledger ledger.Ledger
	opts   Options

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	spaces map[string]*space
	closed bool

	sessions sessionTable
	inFlight httpserve.InFlight
}

// New returns a Server over the ledger of ic. ic serves its own namespace (the stdio
// namespace and the HTTP namespace when no tokens are configured); other namespaces get
// interceptors from Options.NewInterceptor. It returns an error wrapping interceptor.ErrInvalidOptions
// for a nil interceptor or unusable options. New registers Options.Operations on ic.
func New(ic *interceptor.Interceptor, opts Options) (*Server, error) {
	if ic == nil {
		return nil, invalidOptions("nil interceptor")
	}
	if err := opts.normalize(ic.Settings()); err != nil {
		return nil, err
	}
	for name, op := range opts.Operations {
		if err := ic.Register(name, op); err != nil {
			return nil, invalidOptions("%w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		base: ic, ledger: ic.Ledger(), opts: opts, ctx: ctx, cancel: cancel,
		spaces: map[string]*space{},
	}
	if !opts.HTTPStateless {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.sweepSessions(ctx)
		}()
	}
	return s, nil
}

// Namespace returns the namespace of the interceptor given to New.
func (s *Server) Namespace() string { return s.base.Namespace() }

// MCPServer returns the mcp-go server of a namespace, creating it (and its change watcher)
// on first use. It returns an error wrapping lease.ErrClosed after Close, or the error of building the
// namespace's interceptor.
func (s *Server) MCPServer(namespace string) (*server.MCPServer, error) {
	sp, err := s.space(namespace)
	if err != nil {
		return nil, err
	}
	return sp.mcp, nil
}

// ServeStdio serves one MCP client over in and out (a child process's stdin and stdout)
// in namespace (empty: the namespace of the interceptor given to New) until ctx ends or
// in reaches EOF. mcp-go keeps one stdio session per process, so serve at most one stdio
// connection at a time.
func (s *Server) ServeStdio(ctx context.Context, namespace string, in io.Reader, out io.Writer) error {
	sp, err := s.space(cmp.Or(namespace, s.base.Namespace()))
	if err != nil {
		return err
	}
	stdio := server.NewStdioServer(sp.mcp)
	stdio.SetErrorLogger(slog.NewLogLogger(s.opts.Logger.Handler(), slog.LevelError))
	err = stdio.Listen(withStdio(ctx), in, out)
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// Close stops the change watchers and the session sweeper and waits for them. It does not close the ledger, and
// does not end connections being served (cancel their contexts or shut the HTTP server
// down first). It is safe to call more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// space returns the state of a namespace, creating it on first use.
func (s *Server) space(ns string) (*space, error) {
	if ns == "" {
		return nil, invalidOptions("empty namespace")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("mcpserver: server: %w", lease.ErrClosed)
	}
	if sp, ok := s.spaces[ns]; ok {
		return sp, nil
	}
	ic, err := s.interceptorFor(ns)
	if err != nil {
		return nil, err
	}
	sp := newSpace(s, ns, ic)
	s.spaces[ns] = sp
	if w, ok := s.ledger.(ledger.Watcher); ok {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			sp.watch(s.ctx, w)
		}()
	}
	return sp, nil
}

func (s *Server) interceptorFor(ns string) (*interceptor.Interceptor, error) {
	if ns == s.base.Namespace() {
		return s.base, nil
	}
	var (
		ic  *interceptor.Interceptor
		err error
	)
	if s.opts.NewInterceptor != nil {
		ic, err = s.opts.NewInterceptor(ns)
		if err == nil && ic != nil && ic.Namespace() != ns {
			err = invalidOptions("NewInterceptor(%q) returned an interceptor of namespace %q", ns, ic.Namespace())
		}
		if err == nil && ic == nil {
			err = invalidOptions("NewInterceptor(%q) returned nil", ns)
		}
	} else {
		ic, err = s.base.ForNamespace(ns)
	}
	if err != nil {
		return nil, fmt.Errorf("mcpserver: namespace %q: %w", ns, err)
	}
	return ic, nil
}
