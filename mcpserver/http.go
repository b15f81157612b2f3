package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/toolfence/toolfence/internal/httpserve"
	"github.com/toolfence/toolfence/mcpwire"
)

// Handler returns the streamable HTTP handler of the MCP endpoint. Right after
// authentication it refuses what a web page can make a browser send
// (httpserve.CheckBrowser): an Origin header that is not loopback gets 403, a POST whose
// Content-Type is not application/json 415. Every request must carry
// "Authorization: Bearer TOKEN" with a token of Options.Tokens, which selects the namespace;
// others get 401. Without configured tokens it serves only requests that arrive on a
// loopback connection (403 otherwise), in the namespace of the interceptor given to New.
// Request bodies larger than MaxArgs+MaxResult+1 MiB get 413, JSON deeper than
// Options.MaxDepth or with more than Options.MaxValues values 400 (before it is decoded),
// and a request past Options.MaxInFlight (per token) or MaxInFlightTotal 429 with
// Retry-After. Legacy sessions are bound to
// the token that opened them, end after Options.SessionIdle without use, and a token holds
// at most Options.MaxSessions (429 with Retry-After when all of them are busy).
func (s *Server) Handler() http.Handler {
	cfg := s.base.Settings()
	limit := int64(cfg.MaxArgs) + int64(cfg.MaxResult) + 1<<20
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ns, owner, ok := s.authenticate(w, r)
		if !ok {
			return
		}
		if status, why := httpserve.CheckBrowser(r); status != 0 {
			http.Error(w, "toolfence: "+why.Error()+"; nothing was done", status)
			return
		}
		sp, err := s.space(ns)
		if err != nil {
			s.opts.Logger.Error("mcpserver: namespace unavailable", "namespace", ns, "err", err)
			http.Error(w, "toolfence: namespace unavailable", http.StatusServiceUnavailable)
			return
		}
		var method string
		if r.Method == http.MethodPost && r.Body != nil {
			// Taken before the body is read, so buffered bodies are bounded too.
			if full := s.inFlight.Acquire(owner, s.opts.MaxInFlight, s.opts.MaxInFlightTotal); full != "" {
				busy(w, time.Second, full+"; retry after a second")
				return
			}
			defer s.inFlight.Release(owner)
			body, err := readBody(w, r, limit)
			var tooLarge *http.MaxBytesError
			switch {
			case errors.As(err, &tooLarge):
				http.Error(w, fmt.Sprintf("toolfence: request body exceeds %d bytes", limit), http.StatusRequestEntityTooLarge)
				return
			case err != nil:
				http.Error(w, "toolfence: reading the request body: "+err.Error(), http.StatusBadRequest)
				return
			}
			if err := httpserve.CheckShape(body, s.opts.MaxDepth, s.opts.MaxValues); err != nil {
				invalidRequest(w, err.Error())
				return
			}
			method = peekMethod(body)
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		}
		if !s.opts.HTTPStateless {
			id := r.Header.Get(server.HeaderKeySessionID)
			// mcp-go opens a session for a GET without a known session ID; only initialize may.
			if r.Method == http.MethodGet && !s.sessions.owns(id, owner, sp) {
				http.Error(w, "toolfence: a notification stream (GET) needs the Mcp-Session-Id of a live session of this token: initialize first", http.StatusNotFound)
				return
			}
			// Every initialize opens a session (mcp-go ignores a session ID it carries), so each
			// one, whatever its headers, needs room under the token's cap.
			if method == string(mcp.MethodInitialize) {
				release, ok := s.sessions.makeRoom(owner, s.opts.MaxSessions)
				if !ok {
					busy(w, time.Minute, fmt.Sprintf("this token holds %d sessions, each with a request in flight; "+
						"end one (DELETE) or retry later", s.opts.MaxSessions))
					return
				}
				defer release()
			} else if id != "" {
				s.sessions.begin(id)
				defer func() { s.sessions.end(id, sp.now()) }()
			}
		}
		sp.httpHandler().ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ownerKey{}, owner)))
	})
}

// readBody reads r's body, at most limit bytes (an *http.MaxBytesError past it), into one
// buffer of the announced length when there is one.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	var buf bytes.Buffer
	if n := r.ContentLength; n > 0 && n <= limit {
		buf.Grow(int(n) + 1)
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	return buf.Bytes(), err
}

// peekMethod returns the JSON-RPC method of a request body, or "" (for a batch, a response
// or malformed JSON, which the transport answers itself).
func peekMethod(body []byte) string {
	var m struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(body, &m) != nil {
		return ""
	}
	return m.Method
}

// busy answers 429 with Retry-After and a JSON-RPC error saying why and when to retry.
func busy(w http.ResponseWriter, retry time.Duration, why string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", strconv.Itoa(int(retry.Seconds())))
	w.WriteHeader(http.StatusTooManyRequests)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"jsonrpc": "2.0", "id": nil,
		"error": map[string]any{
			"code": errCodeBusy, "message": "toolfence: busy: " + why,
			"data": map[string]any{"retry_after_ms": retry.Milliseconds()},
		},
	})
}

// invalidRequest answers 400 with a JSON-RPC "invalid request" error naming the problem.
func invalidRequest(w http.ResponseWriter, why string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"jsonrpc": "2.0", "id": nil,
		"error": map[string]any{"code": mcp.INVALID_REQUEST, "message": "toolfence: " + why + "; nothing was done"},
	})
}

// errCodeBusy is the JSON-RPC error code of a request refused because a limit is full.
const errCodeBusy = -32000

// authenticate returns the namespace and owner (a digest of the token) of the request, or
// writes 401 / 403 and returns false.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (ns, owner string, ok bool) {
	if s.opts.Tokens.Len() == 0 {
		if !httpserve.LoopbackConn(r) {
			http.Error(w, "toolfence: no bearer tokens are configured, so only loopback connections are served", http.StatusForbidden)
			return "", "", false
		}
		return s.base.Namespace(), "loopback", true
	}
	return s.opts.Tokens.Authenticate(w, r, "toolfence")
}

// ListenAndServe serves Handler at mcpwire.Path on addr until ctx ends, holding at most
// Options.MaxConns connections and closing idle and slow ones (Options.IdleTimeout,
// ReadHeaderTimeout, ReadTimeout), then shuts down (closing
// sessions and waiting up to two seconds for requests in flight). ready, if not nil, is
// called with the bound address once the listener is open. It refuses a non-loopback addr
// without tokens (mcpwire.ErrUnsafeBind) and returns the listener's or server's error otherwise;
// a shutdown because ctx ended returns nil.
func (s *Server) ListenAndServe(ctx context.Context, addr string, ready func(net.Addr)) error {
	if err := mcpwire.CheckBind(addr, s.opts.Tokens.Len()); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("mcpserver: %w", err)
	}
	// "localhost" may resolve to anything: check what was actually bound.
	if err := mcpwire.CheckBind(ln.Addr().String(), s.opts.Tokens.Len()); err != nil {
		ln.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(mcpwire.Path, s.Handler())
	for pattern, h := range s.opts.Handlers {
		mux.Handle(pattern, h)
	}
	base, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	limits := s.opts.httpLimits()
	srv := limits.Server(mux)
	srv.BaseContext = func(net.Listener) context.Context { return base }
	if ready != nil {
		ready(ln.Addr())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(limits.Listener(ln)) }()
	select {
	case err := <-served:
		return fmt.Errorf("mcpserver: %w", err)
	case <-ctx.Done():
	}
	s.closeSessions()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Long-lived notification streams never go idle: end them.
		cancelBase()
		srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("mcpserver: %w", err)
	}
	return nil
}

// closeSessions ends the legacy HTTP sessions of every namespace.
func (s *Server) closeSessions() {
	s.mu.Lock()
	spaces := make([]*space, 0, len(s.spaces))
	for _, sp := range s.spaces {
		spaces = append(spaces, sp)
	}
	s.mu.Unlock()
	for _, sp := range spaces {
		sp.httpHandler().CloseSessions(context.Background())
	}
}
