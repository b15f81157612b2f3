package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/toolfence/toolfence/mcpwire"
)

// sessionIDPrefix starts every session ID this server issues.
const sessionIDPrefix = "tf-session-"

// sessionTable tracks the legacy (protocol ≤ 2025-11-25) HTTP sessions of every namespace:
// who opened each (the token), when it was last used, and how many requests it has in
// flight. It replaces mcp-go's session ID manager, which remembers every terminated ID for
// good, and ends sessions (through the transport's own DELETE path, which frees all the
// transport keeps for them) when they idle past Options.SessionIdle or when their token
// opens more than Options.MaxSessions.
type sessionTable struct {
	mu   sync.Mutex
	byID map[string]*sessionEntry
	// count is the number of sessions of each owner.
	count map[string]int
	// opening is the number of initialize requests of each owner in progress: each holds a
	// place under the cap until it has made its session (or failed to).
	opening map[string]int
}

type sessionEntry struct {
	id, owner  string
	sp         *space
	lastActive time.Time
	inFlight   int
}

// ownerKey carries the owner of a request (a digest of its token) to the session manager.
type ownerKey struct{}

// internalKey marks the DELETE requests the server sends itself to end a session.
type internalKey struct{}

// sessionManager is the server.SessionIdManager of one request's owner in one namespace.
type sessionManager struct {
	t        *sessionTable
	sp       *space
	owner    string
	internal bool
}

// ResolveSessionIdManager implements server.SessionIdManagerResolver.
func (sp *space) ResolveSessionIdManager(r *http.Request) server.SessionIdManager {
	m := &sessionManager{t: &sp.srv.sessions, sp: sp, internal: r == nil}
	if r != nil {
		m.owner, _ = r.Context().Value(ownerKey{}).(string)
		m.internal = r.Context().Value(internalKey{}) != nil
	}
	return m
}

// Generate registers a new session of the owner.
func (m *sessionManager) Generate() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := sessionIDPrefix + hex.EncodeToString(b[:])
	now := m.sp.now()
	m.t.mu.Lock()
	defer m.t.mu.Unlock()
	if m.t.byID == nil {
		m.t.byID, m.t.count = map[string]*sessionEntry{}, map[string]int{}
	}
	m.t.byID[id] = &sessionEntry{id: id, owner: m.owner, sp: m.sp, lastActive: now}
	m.t.count[m.owner]++
	return id
}

// errUnknownSession makes the transport answer 404, which tells a client to initialize anew.
var errUnknownSession = errors.New("mcpserver: unknown session")

// Validate accepts the live sessions of the owner in this namespace; anything else is
// unknown (404), including another token's session.
func (m *sessionManager) Validate(id string) (bool, error) {
	m.t.mu.Lock()
	defer m.t.mu.Unlock()
	e, ok := m.t.byID[id]
	if !ok || e.sp != m.sp || (!m.internal && e.owner != m.owner) {
		return false, errUnknownSession
	}
	return false, nil
}

// Terminate forgets a session (DELETE, or the server ending it). Another owner's DELETE is
// not allowed.
func (m *sessionManager) Terminate(id string) (bool, error) {
	m.t.mu.Lock()
	defer m.t.mu.Unlock()
	e, ok := m.t.byID[id]
	if !ok || e.sp != m.sp {
		return false, nil
	}
	if !m.internal && e.owner != m.owner {
		return true, nil
	}
	m.t.drop(e)
	return false, nil
}

func (t *sessionTable) drop(e *sessionEntry) {
	delete(t.byID, e.id)
	if t.count[e.owner]--; t.count[e.owner] <= 0 {
		delete(t.count, e.owner)
	}
}

// begin marks a request of session id in flight; end marks it done at now. Unknown IDs are
// ignored (the transport answers them 404).
func (t *sessionTable) begin(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byID[id]; ok {
		e.inFlight++
	}
}

func (t *sessionTable) end(id string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byID[id]; ok {
		e.inFlight--
		e.lastActive = now
	}
}

// owns reports whether id is a live session of owner in sp.
func (t *sessionTable) owns(id, owner string, sp *space) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byID[id]
	return ok && e.owner == owner && e.sp == sp
}

// len returns how many sessions are open, and how many of them owner holds.
func (t *sessionTable) len(owner string) (all, owned int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID), t.count[owner]
}

// makeRoom ends the least recently used idle session of owner while its sessions and the
// initializes it has in progress would reach max, then holds a place for one more session
// until release is called (after the initialize's request ends, when its session, if any,
// is counted). It reports false when every session of owner has a request in flight (a
// notification stream, say), so none can be ended.
func (t *sessionTable) makeRoom(owner string, max int) (release func(), ok bool) {
	for {
		t.mu.Lock()
		if t.count[owner]+t.opening[owner] < max {
			if t.opening == nil {
				t.opening = map[string]int{}
			}
			t.opening[owner]++
			t.mu.Unlock()
			return func() {
				t.mu.Lock()
				defer t.mu.Unlock()
				if t.opening[owner]--; t.opening[owner] <= 0 {
					delete(t.opening, owner)
				}
			}, true
		}
		var lru *sessionEntry
		for _, e := range t.byID {
			if e.owner == owner && e.inFlight == 0 && (lru == nil || e.lastActive.Before(lru.lastActive)) {
				lru = e
			}
		}
		t.mu.Unlock()
		if lru == nil {
			return nil, false
		}
		lru.sp.endSession(lru.id)
	}
}

// sweep ends every session without a request in flight whose last request ended before
// now-idle, and returns how many it ended.
func (t *sessionTable) sweep(now time.Time, idle time.Duration) int {
	t.mu.Lock()
	var stale []*sessionEntry
	for _, e := range t.byID {
		if e.inFlight == 0 && now.Sub(e.lastActive) >= idle {
			stale = append(stale, e)
		}
	}
	t.mu.Unlock()
	for _, e := range stale {
		e.sp.endSession(e.id)
	}
	return len(stale)
}

// endSession ends a session through the transport's DELETE path, so that it frees
// everything it holds for the session, and forgets it here.
func (sp *space) endSession(id string) {
	r, err := http.NewRequestWithContext(context.WithValue(context.Background(), internalKey{}, true), http.MethodDelete, mcpwire.Path, nil)
	if err == nil {
		r.Header.Set(server.HeaderKeySessionID, id)
		sp.httpHandler().ServeHTTP(discard{}, r)
	}
	// A session the transport had already forgotten is dropped here all the same.
	t := &sp.srv.sessions
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byID[id]; ok {
		t.drop(e)
	}
}

// sweepSessions ends idle sessions every SessionIdle/4 (on the interceptor's clock) until
// ctx ends.
func (s *Server) sweepSessions(ctx context.Context) {
	clock := s.base.Settings().Clock
	every := max(s.opts.SessionIdle/4, time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-clock.After(every):
			if n := s.sessions.sweep(clock.Now(), s.opts.SessionIdle); n > 0 {
				s.opts.Logger.Debug("mcpserver: ended idle sessions", "count", n)
			}
		}
	}
}

// discard is a ResponseWriter that drops what it is given.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

// Sessions returns how many legacy HTTP sessions are open, in every namespace.
func (s *Server) Sessions() int {
	all, _ := s.sessions.len("")
	return all
}
