package transport

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Mux shares one upstream connection (a stdio child) among many connections, each of which
// speaks as if it had the upstream to itself: what it sends is rewritten on the way up so
// that what comes back reaches it alone. Its request ids and progress tokens are replaced
// by ids of the mux's own, naming the connection ("tfmux:<n>:<seq>"), as is the request id
// its notifications/cancelled names when that request is in flight (one naming an id of
// the mux's that is not its own is dropped: it cannot cancel another's request); an
// upstream answer, progress notification or cancellation goes to the connection its id or
// token names, with the connection's own id or token back in place, and nowhere else. A
// notification of a stateless listen stream (its _meta subscriptionId is the listen
// request's id) goes to the connection that listens. Anything else upstream sends is not a
// connection's: a notification is given to OnNotice (or dropped), a ping is answered, any
// other request is refused (method not found). Meant for stateless (2026-07-28) exchanges,
// where a server sends nothing outside the requests it answers.
//
// A connection that does not read stalls no other: once 64 notifications wait unread for
// it, the next ones for it are dropped (its answers never are). Closing a connection
// cancels its requests still in flight upstream, as the end of an upstream of its own would
// have ended them (a listen stream must not outlive its listener in the shared server).
//
// The shared connection is dialed on the first Open and again on an Open after it ended;
// when it ends, every connection open on it reads what was sent it, then io.EOF, and it is
// closed (with Dial's closer). A Mux needs Dial; its methods are safe for concurrent use.
type Mux struct {
	// Dial opens the shared upstream connection (its Close must end a pending Read); closer,
	// if not nil, ends what is behind it (a stdio child's process group). ctx is the one of
	// the Open that dials: it may bound the dial, but the connection must outlive it.
	Dial func(ctx context.Context) (mcp.Connection, io.Closer, error)
	// OnNotice, if set, gets the notifications upstream sends that belong to no connection
	// (say notifications/tools/list_changed), on the reading goroutine: it must not block.
	OnNotice func(*jsonrpc.Request)

	mu     sync.Mutex
	cur    *muxShared
	closed bool
	live   sync.WaitGroup // the shared connections dialed, until each is closed
}

// muxShared is one dialed upstream connection and the connections open on it.
type muxShared struct {
	up     mcp.Connection
	closer io.Closer
	scope  string        // the TaskScope of its connections
	done   chan struct{} // closed when the reader ended: nothing more is delivered
	shut   sync.Once     // closes up and closer

	mu    sync.Mutex
	next  uint64
	conns map[uint64]*muxConn
}

// muxMaxNotes is how many notifications a connection holds unread; more are dropped.
const muxMaxNotes = 64

// muxPrefix begins every id and token the mux rewrites.
const muxPrefix = "tfmux:"

// Open returns a new connection on the shared upstream connection (dialing it when there is
// none alive; concurrent Opens wait for one dial) and its closer, which is the connection's
// Close. It returns Dial's error when the dial fails (the next Open dials again), and an
// error once the Mux is closed or when it has no Dial.
func (m *Mux) Open(ctx context.Context) (mcp.Connection, io.Closer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, nil, errors.New("transport: the shared upstream is closed")
	}
	if m.Dial == nil {
		return nil, nil, errors.New("transport: Mux.Dial is nil: nothing to dial the shared upstream with")
	}
	sh := m.cur
	if sh != nil {
		select {
		case <-sh.done:
			sh = nil
		default:
		}
	}
	if sh == nil {
		up, closer, err := m.Dial(ctx)
		if err != nil {
			return nil, nil, err
		}
		sh = &muxShared{up: up, closer: closer, scope: "mux-" + rand.Text(), done: make(chan struct{}), conns: map[uint64]*muxConn{}}
		m.cur = sh
		m.live.Add(1)
		go func() {
			defer m.live.Done()
			sh.read(m.OnNotice)
		}()
	}
	sh.mu.Lock()
	sh.next++
	c := &muxConn{sh: sh, n: sh.next, prefix: muxPrefix + strconv.FormatUint(sh.next, 10) + ":",
		ready: make(chan struct{}, 1), closed: make(chan struct{})}
	sh.conns[c.n] = c
	sh.mu.Unlock()
	return c, c, nil
}

// Close ends the shared upstream connection (every open connection reads io.EOF) and
// refuses further Opens. It returns once every shared connection it dialed is closed
// (their closers returned).
func (m *Mux) Close() error {
	m.mu.Lock()
	sh := m.cur
	m.closed, m.cur = true, nil
	m.mu.Unlock()
	if sh != nil {
		sh.close()
	}
	m.live.Wait()
	return nil
}

// Conns returns how many connections are open (not closed) on the shared upstream
// connection last dialed, even if it has ended since; 0 when none was dialed or the Mux is
// closed.
func (m *Mux) Conns() int {
	m.mu.Lock()
	sh := m.cur
	m.mu.Unlock()
	if sh == nil {
		return 0
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return len(sh.conns)
}

// close closes the upstream connection and then its closer, once.
func (sh *muxShared) close() {
	sh.shut.Do(func() {
		_ = sh.up.Close()
		if sh.closer != nil {
			_ = sh.closer.Close()
		}
	})
}

// read delivers what upstream sends until it ends, then closes it: a stdio child that
// closed its stdout is ended with its process group, not left to the next Open's dial.
func (sh *muxShared) read(onNotice func(*jsonrpc.Request)) {
	defer func() {
		close(sh.done)
		sh.close()
	}()
	for {
		msg, err := sh.up.Read(context.Background())
		var bad *BadLineError
		if errors.As(err, &bad) {
			continue // not JSON-RPC: no connection's
		}
		if err != nil {
			return
		}
		switch m := msg.(type) {
		case *jsonrpc.Response:
			if c, id, ok := sh.route(m.ID); ok {
				m.ID = id
				c.deliver(m)
			}
		case *jsonrpc.Request:
			sh.request(m, onNotice)
		}
	}
}

// request routes a request or notification of upstream.
func (sh *muxShared) request(m *jsonrpc.Request, onNotice func(*jsonrpc.Request)) {
	if m.IsCall() {
		resp := &jsonrpc.Response{ID: m.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound,
			Message: "toolfence proxy: a shared upstream's requests reach no host (stateless hosts take none)"}}
		if m.Method == "ping" {
			resp = &jsonrpc.Response{ID: m.ID, Result: json.RawMessage(`{}`)}
		}
		_ = sh.up.Write(context.Background(), resp)
		return
	}
	switch m.Method {
	case "notifications/progress":
		if c, params, ok := sh.routeField(m.Params, "progressToken", (*muxConn).token); ok {
			m.Params = params
			c.deliver(m)
			return
		}
	case "notifications/cancelled":
		if c, params, ok := sh.routeField(m.Params, "requestId", (*muxConn).idJSON); ok {
			m.Params = params
			c.deliver(m)
			return
		}
	default:
		var p struct {
			Meta map[string]json.RawMessage `json:"_meta"`
		}
		var sub string
		if json.Unmarshal(m.Params, &p) == nil && json.Unmarshal(p.Meta[MetaSubscriptionID], &sub) == nil {
			if c := sh.conn(sub); c != nil {
				if orig, ok := c.idJSON(sub); ok {
					m.Params = WithMeta(m.Params, map[string]any{MetaSubscriptionID: orig})
					c.deliver(m)
					return
				}
			}
		}
	}
	if onNotice != nil {
		onNotice(m)
	}
}

// route finds the connection a rewritten id names and its own id (forgotten: an answer
// comes once).
func (sh *muxShared) route(id jsonrpc.ID) (*muxConn, jsonrpc.ID, bool) {
	s, ok := id.Raw().(string)
	if !ok {
		return nil, jsonrpc.ID{}, false
	}
	c := sh.conn(s)
	if c == nil {
		return nil, jsonrpc.ID{}, false
	}
	return c.unwrapID(s)
}

// routeField finds the connection a rewritten params field (a progress token, a cancelled
// request's id) names, and params with the connection's own value (from orig) back in it.
func (sh *muxShared) routeField(params json.RawMessage, field string, orig func(*muxConn, string) (json.RawMessage, bool)) (*muxConn, json.RawMessage, bool) {
	var doc map[string]json.RawMessage
	if json.Unmarshal(params, &doc) != nil {
		return nil, nil, false
	}
	var s string
	if json.Unmarshal(doc[field], &s) != nil {
		return nil, nil, false
	}
	c := sh.conn(s)
	if c == nil {
		return nil, nil, false
	}
	v, ok := orig(c, s)
	if !ok {
		return nil, nil, false
	}
	doc[field] = v
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, nil, false
	}
	return c, out, true
}

// conn is the open connection whose prefix ("tfmux:<n>:") s starts with, or nil.
func (sh *muxShared) conn(s string) *muxConn {
	rest, ok := strings.CutPrefix(s, muxPrefix)
	if !ok {
		return nil
	}
	num, _, ok := strings.Cut(rest, ":")
	if !ok {
		return nil
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		return nil
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.conns[n]
}

// errMuxClosed is the error of a Write on a closed connection of a Mux.
var errMuxClosed = errors.New("transport: the connection is closed")

// muxConn is one connection on a shared upstream connection.
type muxConn struct {
	sh     *muxShared
	n      uint64
	prefix string
	once   sync.Once
	closed chan struct{}

	// What upstream sent the connection and Read has not returned yet. deliver, on the
	// shared reader, never waits: a connection that does not read must not stall the others.
	qmu   sync.Mutex
	queue []jsonrpc.Message
	notes int           // the notifications in queue, at most muxMaxNotes
	ready chan struct{} // holds a token when something was queued since Read last looked

	mu     sync.Mutex
	seq    uint64
	reqs   map[string]*muxReq // rewritten id → the request, until answered
	byOrig map[string]string  // idKey of the connection's id → the rewritten id of its latest request
	gone   bool               // closed: no request is remembered any more
}

// muxReq is a request of a connection, in flight.
type muxReq struct {
	seq   uint64          // its rewritten id is the connection's prefix and seq
	id    jsonrpc.ID      // the connection's id
	token json.RawMessage // its params._meta.progressToken as sent; nil when none
}

var _ mcp.Connection = (*muxConn)(nil)

// muxTokenSuffix ends the progress token the mux puts in place of a request's, after the
// request's rewritten id.
const muxTokenSuffix = ":token"

// wrap rewrites a request of this connection: its id, and params._meta.progressToken if
// any, remembering both until its answer. It fails once the connection is closed.
func (c *muxConn) wrap(id jsonrpc.ID, params json.RawMessage) (jsonrpc.ID, json.RawMessage, error) {
	token := progressToken(params)
	c.mu.Lock()
	if c.gone {
		c.mu.Unlock()
		return jsonrpc.ID{}, nil, errMuxClosed
	}
	c.seq++
	w := c.prefix + strconv.FormatUint(c.seq, 10)
	if c.reqs == nil {
		c.reqs, c.byOrig = map[string]*muxReq{}, map[string]string{}
	}
	c.reqs[w] = &muxReq{seq: c.seq, id: id, token: token}
	c.byOrig[idKey(id)] = w
	c.mu.Unlock()
	if token != nil {
		params = WithMeta(params, map[string]any{"progressToken": w + muxTokenSuffix})
	}
	wid, _ := jsonrpc.MakeID(w)
	return wid, params, nil
}

// progressToken is params._meta.progressToken as sent, or nil.
func progressToken(params json.RawMessage) json.RawMessage {
	if !bytes.Contains(params, []byte(`"progressToken"`)) {
		return nil
	}
	var doc struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	if json.Unmarshal(params, &doc) != nil {
		return nil
	}
	return doc.Meta["progressToken"]
}

// unwrapID returns the connection's id of a rewritten one, forgetting the request.
func (c *muxConn) unwrapID(w string) (*muxConn, jsonrpc.ID, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.reqs[w]
	if !ok {
		return nil, jsonrpc.ID{}, false
	}
	delete(c.reqs, w)
	if k := idKey(r.id); c.byOrig[k] == w {
		delete(c.byOrig, k) // unless a later request reused the id
	}
	return c, r.id, true
}

// idJSON is the connection's id, as JSON, of a rewritten id of a request in flight.
func (c *muxConn) idJSON(w string) (json.RawMessage, bool) {
	c.mu.Lock()
	r, ok := c.reqs[w]
	c.mu.Unlock()
	if !ok {
		return nil, false
	}
	b, err := json.Marshal(r.id.Raw())
	return b, err == nil
}

// token is the connection's progress token, as sent, of a rewritten one of a request in
// flight.
func (c *muxConn) token(w string) (json.RawMessage, bool) {
	w, ok := strings.CutSuffix(w, muxTokenSuffix)
	if !ok {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.reqs[w]
	if !ok || r.token == nil {
		return nil, false
	}
	return r.token, true
}

// deliver queues msg for Read without waiting. A notification is dropped when muxMaxNotes
// wait unread (progress is advisory, and the connection is not keeping up); an answer
// never is (there is one per request the connection sent). Everything is dropped once the
// connection is closed.
func (c *muxConn) deliver(msg jsonrpc.Message) {
	_, note := msg.(*jsonrpc.Request)
	c.qmu.Lock()
	select {
	case <-c.closed:
		c.qmu.Unlock()
		return
	default:
	}
	if note && c.notes >= muxMaxNotes {
		c.qmu.Unlock()
		return
	}
	c.queue = append(c.queue, msg)
	if note {
		c.notes++
	}
	c.qmu.Unlock()
	select {
	case c.ready <- struct{}{}:
	default: // Read has a token already
	}
}

// pop takes the first queued message.
func (c *muxConn) pop() (jsonrpc.Message, bool) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if len(c.queue) == 0 {
		return nil, false
	}
	m := c.queue[0]
	c.queue[0] = nil
	c.queue = c.queue[1:]
	if len(c.queue) == 0 {
		c.queue = nil // let the array go
	}
	if _, note := m.(*jsonrpc.Request); note {
		c.notes--
	}
	return m, true
}

// Read returns the next message upstream sent this connection; io.EOF once the connection
// is closed, or once the shared connection ended and what it sent before is read.
func (c *muxConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		select {
		case <-c.closed:
			return nil, io.EOF
		default:
		}
		if m, ok := c.pop(); ok {
			return m, nil
		}
		select {
		case <-c.ready:
		case <-c.closed:
			return nil, io.EOF
		case <-c.sh.done: // nothing is delivered any more
			if m, ok := c.pop(); ok {
				return m, nil
			}
			return nil, io.EOF
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Write sends msg upstream with this connection's ids and tokens rewritten (see Mux); a
// response is dropped (upstream's requests reach no connection: the mux answers them). It
// fails once the connection is closed, with an error wrapping io.EOF once the shared
// connection ended, and with upstream's Write error (the request is then forgotten).
func (c *muxConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	select {
	case <-c.closed:
		return errMuxClosed
	case <-c.sh.done:
		return fmt.Errorf("transport: the shared upstream ended: %w", io.EOF)
	default:
	}
	req, ok := msg.(*jsonrpc.Request)
	if !ok {
		return nil // an answer to an upstream request: the mux answers those itself
	}
	out := *req
	switch {
	case req.IsCall():
		var err error
		if out.ID, out.Params, err = c.wrap(req.ID, req.Params); err != nil {
			return err
		}
	case req.Method == "notifications/cancelled":
		params, ok := c.rewriteCancelled(req.Params)
		if !ok {
			return nil // names another connection's request: not this one's to cancel
		}
		out.Params = params
	}
	err := c.sh.up.Write(ctx, &out)
	if err != nil && req.IsCall() {
		c.unwrapID(out.ID.Raw().(string)) // not sent: no answer will come
	}
	return err
}

// rewriteCancelled rewrites the request id a notifications/cancelled names, when it is one
// of this connection's requests in flight; other params pass unchanged, except that ok is
// false (send nothing) when the id is in the mux's space: it can only name another
// connection's request, or nothing.
func (c *muxConn) rewriteCancelled(params json.RawMessage) (_ json.RawMessage, ok bool) {
	var doc map[string]json.RawMessage
	if json.Unmarshal(params, &doc) != nil {
		return params, true
	}
	var v any
	if json.Unmarshal(doc["requestId"], &v) != nil {
		return params, true
	}
	id, err := jsonrpc.MakeID(v)
	if err != nil {
		return params, true
	}
	c.mu.Lock()
	w, mine := c.byOrig[idKey(id)]
	c.mu.Unlock()
	if !mine {
		s, _ := v.(string)
		return params, !strings.HasPrefix(s, muxPrefix)
	}
	doc["requestId"], _ = json.Marshal(w)
	out, err := json.Marshal(doc)
	if err != nil {
		return params, true
	}
	return out, true
}

// Close ends this connection (not the shared one): it forgets the connection's requests in
// flight and cancels them upstream (notifications/cancelled, in the order they were sent),
// as the end of a connection of its own would have ended them; their answers are dropped.
func (c *muxConn) Close() error {
	c.once.Do(func() {
		c.qmu.Lock()
		close(c.closed)
		c.queue, c.notes = nil, 0
		c.qmu.Unlock()
		c.sh.mu.Lock()
		delete(c.sh.conns, c.n)
		c.sh.mu.Unlock()
		c.mu.Lock()
		pending := make([]*muxReq, 0, len(c.reqs))
		for _, r := range c.reqs {
			pending = append(pending, r)
		}
		c.reqs, c.byOrig, c.gone = nil, nil, true
		c.mu.Unlock()
		slices.SortFunc(pending, func(a, b *muxReq) int { return cmp.Compare(a.seq, b.seq) })
		for _, r := range pending {
			params, _ := json.Marshal(map[string]string{"requestId": c.prefix + strconv.FormatUint(r.seq, 10), "reason": "the connection closed"})
			if c.sh.up.Write(context.Background(), &jsonrpc.Request{Method: "notifications/cancelled", Params: params}) != nil {
				break // the shared connection is down: nothing to cancel
			}
		}
	})
	return nil
}

// SessionID is "": the shared connection is nobody's session.
func (c *muxConn) SessionID() string { return "" }

// TaskScope names the shared connection ("mux-" and a random id of its own, never another's,
// even in another process): task ids belong to its server (the child).
func (c *muxConn) TaskScope() string { return c.sh.scope }
