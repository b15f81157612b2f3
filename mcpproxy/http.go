package mcpproxy

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolfence/toolfence/internal/httpserve"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/mcpproxy/transport"
	"github.com/toolfence/toolfence/mcpwire"
)

// Dialer opens one upstream session: a connection and what ends it (for a stdio child, its
// process group). The HTTP server calls it once per host session.
type Dialer func(ctx context.Context) (mcp.Connection, io.Closer, error)

// HTTPOptions configure an HTTPServer.
type HTTPOptions struct {
	// Dial opens the upstream session of each host session. Required.
	Dial Dialer
	// Tokens map bearer tokens to namespaces (as toolfence serve's). Without any, only
	// loopback connections are served, in the namespace of the proxy's interceptor.
	Tokens mcpwire.Tokens
	// MaxSessions caps the sessions one token holds at once: a new one ends the least
	// recently used idle session, or gets 429 when all of them have a request in flight.
	// Defaults to mcpwire.DefaultMaxSessions.
	MaxSessions int
	// SessionIdle ends a session (and its upstream) without requests for this long.
	// Defaults to mcpwire.DefaultSessionIdle, or mcpwire.DefaultChildIdle with Children.
	SessionIdle time.Duration
	// Children says that Dial starts a child process for each session (a stdio upstream),
	// which holds memory while the session lives. Then only a POST in progress keeps a
	// session from being ended by SessionIdle, MaxSessions or MaxChildren (an open
	// notification stream does not, as for the Go SDK's own server's SessionTimeout), and
	// sessions are capped by MaxChildren over all tokens.
	Children bool
	// MaxChildren caps the sessions open at once over all tokens when Children is set, the
	// ones still ending (their child not yet exited) included. A new session at the cap
	// waits for an ending one, else ends the least recently used session without a POST in
	// progress (one without a notification stream first) and waits for its child to exit;
	// when every session has a POST in progress it gets 429 with Retry-After. Defaults to
	// mcpwire.DefaultMaxChildren; ignored without Children.
	MaxChildren int
	// MaxBody bounds a request body. Defaults to the interceptor's MaxArgs plus 1 MiB.
	MaxBody int64
	// MaxDepth caps how deeply a POST's JSON nests objects and arrays; a deeper one gets
	// 400 (JSON-RPC -32600) before it is decoded, and nothing is relayed. Defaults to
	// mcpwire.DefaultMaxDepth.
	MaxDepth int
	// MaxValues caps the objects, arrays and elements in a POST's JSON (each '{', '[' and
	// ',' outside strings counts one); more get 400 as for MaxDepth. Defaults to
	// mcpwire.DefaultMaxValues.
	MaxValues int
	// MaxInFlight caps the POSTs one token has in progress at once (a POST is in progress
	// from before its body is read until its answer ends, streamed or not; notification
	// streams (GET) do not count); more get 429 with Retry-After. Defaults to
	// mcpwire.DefaultMaxInFlight.
	MaxInFlight int
	// MaxInFlightTotal caps the POSTs in progress at once over all tokens; more get 429 as
	// for MaxInFlight. Defaults to mcpwire.DefaultMaxInFlightTotal.
	MaxInFlightTotal int
	// Clock reads the time of session expiry. Defaults to the interceptor's clock.
	Clock lease.Clock
	// Logger gets session events and failures (never tokens). Defaults to the proxy's.
	Logger *slog.Logger
	// OnSessionEnd, if set, is called with a session's id once it has ended and its
	// upstream is closed (a stdio child has exited).
	OnSessionEnd func(id string)
	// SharedUpstream makes stateless (2026-07-28) host requests share one upstream
	// connection, dialed once (and again after it ends) and multiplexed (transport.Mux): set
	// it for a stdio upstream, so that they need no child process each. Unset, each stateless
	// request dials its own connection, as an HTTP upstream's speaks without a session.
	SharedUpstream bool
}

// HTTPServer serves the proxy to MCP hosts over streamable HTTP: each host session gets its
// own upstream session (Options.Dial) and the namespace of its bearer token.
//
// Why a handler of our own rather than go-sdk's StreamableServerTransport: that transport
// routes a message to the HTTP response of the request it belongs to only through a context
// key of its own package, set by its mcp.Server; a relay that has no mcp.Server cannot set
// it, so every progress notification would go to the notification stream (GET), which
// hosts need not open (mcp-go's client does not by default), and its Write fails when that
// stream is missing, which would end the relay. Here a progress notification follows its
// progressToken to the stream of its request; other messages go to the GET stream, else to
// the most recent open request stream, else wait (at most 1024) for one. Each stream queues
// at most maxStreamMessages or maxStreamBytes the host has not read: past that a
// notification is dropped, any other message ends the stream (the host reconnects).
type HTTPServer struct {
	p    *Proxy
	opts HTTPOptions
	log  *slog.Logger
	ctx  context.Context // sessions live in it; cancelled by Close
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu       sync.Mutex
	spaces   map[string]*Proxy
	sessions map[string]*httpSession // until their upstream is closed (a child has exited)
	opening  map[string]int          // owner → initializes in progress
	openings int                     // initializes in progress over all owners
	closed   bool

	inFlight httpserve.InFlight // POSTs in progress, under MaxInFlight and MaxInFlightTotal
	mux      *transport.Mux     // the shared upstream of stateless requests (link.go), under mu
	// statelessDirect: the HTTP upstream speaks a stateless revision; each stateless request
	// dials its own connection (under mu).
	statelessDirect bool
	// statelessCalls are the stateless requests in flight, by owner and host id (under mu),
	// for the host's notifications/cancelled.
	statelessCalls map[string]*downConn
}

// httpSession is one host session: its connection, its owner (a digest of the token) and
// its use.
type httpSession struct {
	id, owner  string
	conn       *downConn
	lastActive time.Time
	posts      int           // POSTs (and DELETEs) in progress
	streams    int           // notification streams (GET) open
	done       chan struct{} // closed once Serve returned and the upstream is closed
}

// NewHTTPServer returns the HTTP server of p. It returns an error when Dial is missing or a
// limit is negative (naming the limits); a zero limit means its default.
func (p *Proxy) NewHTTPServer(opts HTTPOptions) (*HTTPServer, error) {
	switch {
	case opts.Dial == nil:
		return nil, errors.New("mcpproxy: HTTPOptions.Dial is required")
	case opts.MaxSessions < 0, opts.SessionIdle < 0, opts.MaxBody < 0:
		return nil, errors.New("mcpproxy: negative HTTP limit")
	case opts.MaxChildren < 0:
		return nil, errors.New("mcpproxy: HTTPOptions.MaxChildren must not be negative")
	case opts.MaxDepth < 0, opts.MaxValues < 0, opts.MaxInFlight < 0, opts.MaxInFlightTotal < 0:
		return nil, errors.New("mcpproxy: HTTPOptions.MaxDepth, MaxValues, MaxInFlight and MaxInFlightTotal must not be negative")
	}
	opts.MaxSessions = cmp.Or(opts.MaxSessions, mcpwire.DefaultMaxSessions)
	opts.MaxDepth = cmp.Or(opts.MaxDepth, mcpwire.DefaultMaxDepth)
	opts.MaxValues = cmp.Or(opts.MaxValues, mcpwire.DefaultMaxValues)
	opts.MaxInFlight = cmp.Or(opts.MaxInFlight, mcpwire.DefaultMaxInFlight)
	opts.MaxInFlightTotal = cmp.Or(opts.MaxInFlightTotal, mcpwire.DefaultMaxInFlightTotal)
	opts.MaxChildren = cmp.Or(opts.MaxChildren, mcpwire.DefaultMaxChildren)
	if opts.Children {
		opts.SessionIdle = cmp.Or(opts.SessionIdle, mcpwire.DefaultChildIdle)
	}
	opts.SessionIdle = cmp.Or(opts.SessionIdle, mcpwire.DefaultSessionIdle)
	opts.MaxBody = cmp.Or(opts.MaxBody, int64(p.ic.Settings().MaxArgs)+1<<20)
	if opts.Clock == nil {
		opts.Clock = p.ic.Settings().Clock
	}
	if opts.Clock == nil {
		opts.Clock = lease.Real{}
	}
	log := cmp.Or(opts.Logger, p.log)
	ctx, stop := context.WithCancel(context.Background())
	h := &HTTPServer{p: p, opts: opts, log: log, ctx: ctx, stop: stop,
		spaces: map[string]*Proxy{p.ic.Namespace(): p}, sessions: map[string]*httpSession{}, opening: map[string]int{}}
	if opts.SharedUpstream {
		h.mux = h.newMux(true)
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.sweepEvery()
	}()
	return h, nil
}

// space returns the proxy of namespace ns: the same settings and policy over the same
// ledger, through the interceptor's ForNamespace (no copy of the barrier).
func (h *HTTPServer) space(ns string) (*Proxy, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p, ok := h.spaces[ns]; ok {
		return p, nil
	}
	ic, err := h.p.ic.ForNamespace(ns)
	if err != nil {
		return nil, err
	}
	p, err := New(ic, h.p.cfg)
	if err != nil {
		return nil, err
	}
	p.memory = h.p.memory // one upstream: what one namespace protects, all do
	h.spaces[ns] = p
	return p, nil
}

// ServeHTTP serves the streamable HTTP transport of MCP (POST, GET, DELETE) at any path.
// Every request needs "Authorization: Bearer TOKEN" of HTTPOptions.Tokens (401 otherwise);
// without tokens, only loopback connections (403 otherwise). An initialize without a
// session id opens a session (its upstream session too; 502 when that fails); every other
// request needs an Mcp-Session-Id (400 without) of a live session of the same token (404
// otherwise, so the host initializes anew). A POST past HTTPOptions.MaxInFlight of its
// token or MaxInFlightTotal gets 429 with Retry-After before its body is read; one whose
// body exceeds MaxBody 413, and one whose JSON nests deeper than MaxDepth or holds more
// than MaxValues values 400 (JSON-RPC -32600) before it is decoded. Nothing of a refused
// request is relayed upstream.
func (h *HTTPServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ns, owner, ok := h.authenticate(w, r)
	if !ok {
		return
	}
	switch r.Method {
	case http.MethodPost, http.MethodGet, http.MethodDelete:
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		http.Error(w, "toolfence proxy: method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if h.opts.Tokens.Len() == 0 && !loopbackOrigin(r) {
		// Without a token, a page of any web site the host's browser shows could reach a
		// loopback proxy; a browser sends its Origin.
		http.Error(w, "toolfence proxy: no bearer tokens are configured, so requests from a web page of another origin (Origin header "+
			strconv.Quote(r.Header.Get("Origin"))+") are refused; only loopback origins are served", http.StatusForbidden)
		return
	}
	var msgs []jsonrpc.Message
	batch := false
	if r.Method == http.MethodPost {
		// A browser sends a cross-site text/plain POST without asking first (no CORS
		// preflight); application/json it must ask for.
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			http.Error(w, "toolfence proxy: a POST must have Content-Type: application/json", http.StatusUnsupportedMediaType)
			return
		}
		// Taken before the body is read, so the bodies held at once are bounded too; held
		// until the answer ends (a streamed one until upstream answers).
		if full := h.inFlight.Acquire(owner, h.opts.MaxInFlight, h.opts.MaxInFlightTotal); full != "" {
			busy(w, time.Second, "toolfence proxy: busy: "+full+"; nothing was relayed, retry after a second")
			return
		}
		defer h.inFlight.Release(owner)
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBody))
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			http.Error(w, fmt.Sprintf("toolfence proxy: request body exceeds %d bytes", h.opts.MaxBody), http.StatusRequestEntityTooLarge)
			return
		case err != nil:
			http.Error(w, "toolfence proxy: reading the request body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if err := httpserve.CheckShape(body, h.opts.MaxDepth, h.opts.MaxValues); err != nil {
			jsonError(w, http.StatusBadRequest, codeInvalidRequest, "toolfence proxy: "+err.Error()+"; nothing was relayed")
			return
		}
		batch = len(bytes.TrimSpace(body)) > 0 && bytes.TrimSpace(body)[0] == '['
		if msgs, err = transport.DecodeMessages(body); err != nil || len(msgs) == 0 {
			jsonError(w, http.StatusBadRequest, jsonrpc.CodeParseError, "toolfence proxy: the body is not a JSON-RPC message or batch")
			return
		}
		if batch && isInitialize(msgs) {
			jsonError(w, http.StatusBadRequest, codeInvalidRequest, "toolfence proxy: initialize must be sent alone, not in a batch")
			return
		}
	}
	id := r.Header.Get("Mcp-Session-Id")
	if r.Method == http.MethodPost && id == "" && statelessRequest(r, msgs) {
		h.serveStateless(w, r, ns, owner, msgs, batch)
		return
	}
	var sess *httpSession
	if r.Method == http.MethodPost && isInitialize(msgs) && id == "" {
		p, err := h.space(ns)
		if err != nil {
			h.log.Error("toolfence proxy: namespace unavailable", "namespace", ns, "err", err)
			http.Error(w, "toolfence proxy: namespace unavailable", http.StatusServiceUnavailable)
			return
		}
		if sess = h.open(w, r, p, owner); sess == nil {
			return
		}
	} else if id == "" {
		http.Error(w, "toolfence proxy: no Mcp-Session-Id: send initialize first (this server keeps a session per host)", http.StatusBadRequest)
		return
	} else if sess = h.use(id, owner, r.Method == http.MethodGet); sess == nil {
		http.Error(w, "toolfence proxy: unknown or ended session (Mcp-Session-Id): initialize a new one", http.StatusNotFound)
		return
	}
	// The request stops counting as in flight before its last bytes can reach the host
	// (idle), so a host that has its answer never finds its session still busy (a new
	// session at the cap ends the least recently used idle one).
	var released sync.Once
	idle := func() { released.Do(func() { h.release(sess, r.Method == http.MethodGet) }) }
	defer idle()
	switch r.Method {
	case http.MethodDelete:
		h.end(sess)
		w.WriteHeader(http.StatusOK)
	case http.MethodGet:
		sess.conn.serveGET(w, r)
	case http.MethodPost:
		sess.conn.servePOST(w, r, msgs, batch, idle)
	}
}

func isInitialize(msgs []jsonrpc.Message) bool {
	for _, m := range msgs {
		if r, ok := m.(*jsonrpc.Request); ok && r.Method == "initialize" {
			return true
		}
	}
	return false
}

// authenticate returns the namespace and owner (a digest of the token) of r, or answers
// 401 / 403 and returns false.
func (h *HTTPServer) authenticate(w http.ResponseWriter, r *http.Request) (ns, owner string, ok bool) {
	if h.opts.Tokens.Len() == 0 {
		if !httpserve.LoopbackConn(r) {
			http.Error(w, "toolfence proxy: no bearer tokens are configured, so only loopback connections are served", http.StatusForbidden)
			return "", "", false
		}
		// Without a token, a web page could reach a loopback proxy through a DNS name it
		// controls (DNS rebinding): only loopback names are served.
		if !loopbackHost(r.Host) {
			http.Error(w, "toolfence proxy: no bearer tokens are configured, so only requests to a loopback host name (localhost, 127.0.0.1, [::1]) are served", http.StatusForbidden)
			return "", "", false
		}
		return h.p.ic.Namespace(), "loopback", true
	}
	return h.opts.Tokens.Authenticate(w, r, "toolfence proxy")
}

// loopbackOrigin reports whether r has no Origin header or one loopback origin
// (httpserve.LoopbackOrigin: http://localhost:3000, http://127.0.0.1); "null", other
// origins and repeated Origin headers are not.
func loopbackOrigin(r *http.Request) bool {
	o, ok := r.Header["Origin"]
	return !ok || (len(o) == 1 && httpserve.LoopbackOrigin(o[0]))
}

// loopbackHost reports whether the host[:port] of a Host header names a loopback address.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	return httpserve.LoopbackHost(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
}

// open makes room under owner's cap (and MaxChildren), dials the upstream and starts a
// session relayed by p, in flight (release it). It answers 429, 502 or 503 and returns nil
// when it cannot.
func (h *HTTPServer) open(w http.ResponseWriter, r *http.Request, p *Proxy, owner string) *httpSession {
	if full, retry := h.makeRoom(r.Context(), owner); full != "" {
		busy(w, retry, "toolfence proxy: busy: "+full)
		return nil
	}
	defer func() {
		h.mu.Lock()
		if h.opening[owner]--; h.opening[owner] <= 0 {
			delete(h.opening, owner)
		}
		h.openings--
		h.mu.Unlock()
	}()
	up, closer, err := h.opts.Dial(h.ctx)
	if err != nil {
		h.log.Error("toolfence proxy: cannot open an upstream session", "err", err)
		jsonError(w, http.StatusBadGateway, transport.CodeUpstreamHTTP, "toolfence proxy: cannot open a session with the upstream server: "+err.Error())
		return nil
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	s := &httpSession{id: "tf-proxy-" + hex.EncodeToString(b[:]), owner: owner, posts: 1,
		lastActive: h.opts.Clock.Now(), done: make(chan struct{})}
	s.conn = newDownConn(s.id, h.log)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		_ = up.Close()
		_ = closer.Close()
		http.Error(w, "toolfence proxy: shutting down", http.StatusServiceUnavailable)
		return nil
	}
	h.sessions[s.id] = s
	h.wg.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.wg.Done()
		switch err := p.Serve(h.ctx, s.conn, up); {
		case err == nil:
		case h.ctx.Err() != nil || s.conn.isClosed():
			// A normal end: the server shut down (SIGTERM) or ended the session (the
			// host's DELETE, idle), whichever of Serve's reasons won.
			h.log.Debug("toolfence proxy: session ended", "session", s.id, "err", err)
		default:
			h.log.Warn("toolfence proxy: session ended", "session", s.id, "err", err)
		}
		_ = closer.Close()
		h.mu.Lock()
		delete(h.sessions, s.id)
		h.mu.Unlock()
		close(s.done)
		if h.opts.OnSessionEnd != nil {
			h.opts.OnSessionEnd(s.id)
		}
	}()
	return s
}

// childEndWait bounds how long a new session waits at MaxChildren for an ending session's
// child to exit (it gets EOF, SIGTERM 2 s later, SIGKILL 2 s after that).
const childEndWait = 10 * time.Second

// makeRoom holds a place for a new session of owner: while owner's sessions and initializes
// in progress reach MaxSessions it ends owner's least recently used idle session; with
// Children, while all sessions (ending ones included) and initializes reach MaxChildren it
// waits for an ending session's child to exit, ending the least recently used idle session
// of any owner first when none is ending. It returns why it cannot (and when to retry),
// or "" once the place is held.
func (h *HTTPServer) makeRoom(ctx context.Context, owner string) (full string, retry time.Duration) {
	var timeout <-chan time.Time
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		n := h.opening[owner]
		var lru *httpSession
		for _, s := range h.sessions {
			if s.owner != owner || s.conn.isClosed() {
				continue
			}
			n++
			if !h.holds(s) && (lru == nil || s.lastActive.Before(lru.lastActive)) {
				lru = s
			}
		}
		if n >= h.opts.MaxSessions {
			if lru == nil {
				return fmt.Sprintf("this token holds %d sessions, each with a request in flight; end one (DELETE) or retry later", h.opts.MaxSessions), time.Minute
			}
			h.log.Info("toolfence proxy: ended the least recently used session of a token at its cap", "session", lru.id)
			lru.conn.Close()
			continue
		}
		if h.opts.Children && len(h.sessions)+h.openings >= h.opts.MaxChildren {
			ending := h.endingChild()
			if ending == nil {
				return fmt.Sprintf("%d sessions hold a child process of the upstream (the cap over all tokens), each with a request in flight; retry later, or end a session (DELETE)", h.opts.MaxChildren), 5 * time.Second
			}
			if timeout == nil {
				timeout = h.opts.Clock.After(childEndWait)
			}
			h.mu.Unlock()
			gaveUp := false
			select {
			case <-ending:
			case <-timeout:
				gaveUp = true
			case <-ctx.Done():
				gaveUp = true
			}
			h.mu.Lock()
			if gaveUp {
				return fmt.Sprintf("%d sessions hold a child process of the upstream (the cap over all tokens) and the ones ended to make room have not exited yet; retry later", h.opts.MaxChildren), 5 * time.Second
			}
			continue
		}
		h.opening[owner]++
		h.openings++
		return "", 0
	}
}

// endingChild returns the done channel of a session that is ending (its child not yet
// exited); when none is, it ends the least recently used session not held by a POST (one
// without a notification stream first) and returns its channel; nil when every session is
// held. Call with mu held.
func (h *HTTPServer) endingChild() <-chan struct{} {
	// before says whether a is to end before b: without a notification stream (its host
	// may be gone), then the least recently used.
	before := func(a, b *httpSession) bool {
		if (a.streams == 0) != (b.streams == 0) {
			return a.streams == 0
		}
		return a.lastActive.Before(b.lastActive)
	}
	var lru *httpSession
	for _, s := range h.sessions {
		if s.conn.isClosed() {
			return s.done
		}
		if !h.holds(s) && (lru == nil || before(s, lru)) {
			lru = s
		}
	}
	if lru == nil {
		return nil
	}
	h.log.Info("toolfence proxy: ended the least recently used session at the cap of child processes", "session", lru.id, "max_children", h.opts.MaxChildren)
	lru.conn.Close()
	return lru.done
}

// holds reports whether s is in use so that no bound may end it: a POST in progress, or,
// unless its upstream is a child of its own (Children), an open notification stream. Call
// with mu held.
func (h *HTTPServer) holds(s *httpSession) bool {
	return s.posts > 0 || (!h.opts.Children && s.streams > 0)
}

// use marks a live session of owner in use (a notification stream when get), or returns
// nil.
func (h *HTTPServer) use(id, owner string, get bool) *httpSession {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sessions[id]
	if !ok || s.owner != owner || s.conn.isClosed() {
		return nil
	}
	if get {
		s.streams++
	} else {
		s.posts++
	}
	return s
}

// release ends a use of s that use (or open) began, and marks s active now.
func (h *HTTPServer) release(s *httpSession, get bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if get {
		s.streams--
	} else {
		s.posts--
	}
	s.lastActive = h.opts.Clock.Now()
}

// end ends a session: its relay stops reading the host, settles the calls in flight and
// closes the upstream session.
func (h *HTTPServer) end(s *httpSession) { s.conn.Close() }

// Sweep ends every session without a request in flight (with Children: without a POST in
// progress; an open notification stream does not count) whose last request ended
// SessionIdle ago or more (by Clock), and returns how many it ended. The server sweeps
// every SessionIdle/4 (at least every second) on its own.
func (h *HTTPServer) Sweep() int {
	now := h.opts.Clock.Now()
	h.mu.Lock()
	var stale []*httpSession
	for _, s := range h.sessions {
		if !h.holds(s) && !s.conn.isClosed() && now.Sub(s.lastActive) >= h.opts.SessionIdle {
			stale = append(stale, s)
		}
	}
	h.mu.Unlock()
	for _, s := range stale {
		h.log.Info("toolfence proxy: ended an idle session", "session", s.id)
		h.end(s)
	}
	return len(stale)
}

func (h *HTTPServer) sweepEvery() {
	every := max(h.opts.SessionIdle/4, time.Second)
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-h.opts.Clock.After(every):
			h.Sweep()
		}
	}
}

// InFlight returns how many POSTs are in progress (holding a slot under
// HTTPOptions.MaxInFlight and MaxInFlightTotal), over every token.
func (h *HTTPServer) InFlight() int { return h.inFlight.Total() }

// Sessions returns how many host sessions are open (their upstream not yet closed).
func (h *HTTPServer) Sessions() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sessions)
}

// Close ends every session, waits until their upstreams are closed (a guarded call in
// flight is settled first, within its timeout), and stops the sweeper. It returns nil.
func (h *HTTPServer) Close() error {
	h.mu.Lock()
	h.closed = true
	all := make([]*httpSession, 0, len(h.sessions))
	for _, s := range h.sessions {
		all = append(all, s)
	}
	h.mu.Unlock()
	for _, s := range all {
		h.end(s)
	}
	h.stop()
	h.wg.Wait()
	// Stateless hosts can no longer continue their multi-round calls.
	h.p.abandonRounds(nil, "the proxy shut down")
	h.mu.Lock()
	mux := h.mux
	h.mu.Unlock()
	if mux != nil {
		_ = mux.Close()
	}
	return nil
}

// ListenAndServe serves the proxy at mcpwire.Path ("/mcp") on addr under limits until ctx
// ends, then closes every session and shuts the server down. It refuses a non-loopback
// address without tokens (mcpwire.ErrUnsafeBind). ready, if not nil, gets the bound
// address once the listener is open. A shutdown because ctx ended returns nil.
func (h *HTTPServer) ListenAndServe(ctx context.Context, addr string, limits httpserve.Limits, ready func(net.Addr)) error {
	if err := limits.Validate(); err != nil {
		return err
	}
	if err := mcpwire.CheckBind(addr, h.opts.Tokens.Len()); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("mcpproxy: %w", err)
	}
	if err := mcpwire.CheckBind(ln.Addr().String(), h.opts.Tokens.Len()); err != nil {
		ln.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(mcpwire.Path, h)
	srv := limits.Server(mux)
	if ready != nil {
		ready(ln.Addr())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(limits.Listener(ln)) }()
	select {
	case err := <-served:
		_ = h.Close()
		return fmt.Errorf("mcpproxy: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	go func() { _ = h.Close() }() // ends streams, so Shutdown can finish
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	_ = h.Close()
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("mcpproxy: %w", err)
	}
	return nil
}

// codeBusy is the JSON-RPC error code of a request refused because a limit is full (as
// serve's).
const codeBusy = -32000

// jsonError answers status with a JSON-RPC error without id.
// busy answers 429 with Retry-After and a JSON-RPC busy error (codeBusy) whose data says
// when to retry (retry_after_ms), as serve's busy answer does.
func busy(w http.ResponseWriter, retry time.Duration, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", strconv.Itoa(int(retry.Seconds())))
	w.WriteHeader(http.StatusTooManyRequests)
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{
		"code": codeBusy, "message": msg, "data": map[string]any{"retry_after_ms": retry.Milliseconds()},
	}})
}

func jsonError(w http.ResponseWriter, status int, code int64, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": code, "message": msg}})
}
