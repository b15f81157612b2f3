package mcpproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// A host and its upstream need not speak the same revision. Relayed unchanged, a
// conversation is in the host's revision; when the upstream does not serve it, the proxy
// bridges with one of two connections over the upstream's (docs/proxy.md "Protocol
// revisions"):
//
//   - legacyUp: a stateless (2026-07-28) host in front of a 2025-11-25-only upstream. The
//     proxy initializes one upstream session itself (declaring elicitation, sampling and
//     roots), answers server/discover from its InitializeResult, and gives every result a
//     resultType. The upstream's requests for input during a host's call become
//     input_required rounds of that call (as a 2026-07-28 server asks); ping is answered.
//   - statelessUp: a 2025-11-25 host in front of a 2026-07-28-only upstream. The proxy
//     answers initialize from server/discover, ping and logging/setLevel itself, carries the
//     host's revision, capabilities and log level in each request's _meta, and turns an
//     input_required answer into the host's own requests (elicitation/create,
//     sampling/createMessage, roots/list), sending the call again with their answers, as a
//     2026-07-28 client does: the host and the proxy's guard see one call and one answer.

// bridgeIDPrefix begins the ids of the requests the bridges send themselves (to the upstream
// or to the host).
const bridgeIDPrefix = "toolfence-bridge:"

// supportsStateless reports whether a server/discover answer lists a stateless revision:
// its supportedVersions, or those of its UnsupportedProtocolVersion error (-32022: the
// server speaks other stateless revisions than the one asked; the host negotiates).
func supportsStateless(resp *jsonrpc.Response) bool {
	if resp == nil {
		return false
	}
	var versions []string
	if resp.Error != nil {
		var we *jsonrpc.Error
		if !errors.As(resp.Error, &we) || we.Code != transport.CodeUnsupportedProtocol {
			return false
		}
		var d struct {
			Supported []string `json:"supported"`
		}
		_ = json.Unmarshal(we.Data, &d)
		versions = d.Supported
	} else {
		var d struct {
			SupportedVersions []string `json:"supportedVersions"`
		}
		if json.Unmarshal(resp.Result, &d) != nil {
			return false
		}
		versions = d.SupportedVersions
	}
	for _, v := range versions {
		if transport.Stateless(v) {
			return true
		}
	}
	return false
}

// bridge is what both bridges share: the upstream connection, a reader of it, and the
// messages for the proxy that did not come from upstream as they are.
type bridge struct {
	up   mcp.Connection
	out  chan jsonrpc.Message // for Read
	done chan struct{}
	once sync.Once

	mu      sync.Mutex
	seq     uint64
	waiting replies // the bridge's own requests, by id
	readErr error
}

func newBridge(up mcp.Connection) bridge {
	return bridge{up: up, out: make(chan jsonrpc.Message, 64), done: make(chan struct{})}
}

// nextID is a fresh id of the bridge's own.
func (b *bridge) nextID() (jsonrpc.ID, string) {
	b.mu.Lock()
	b.seq++
	n := b.seq
	b.mu.Unlock()
	s := bridgeIDPrefix + strconv.FormatUint(n, 10)
	id, _ := jsonrpc.MakeID(s)
	return id, s
}

// emit hands msg to Read.
func (b *bridge) emit(msg jsonrpc.Message) {
	select {
	case b.out <- msg:
	case <-b.done:
	}
}

// Read returns the next message for the proxy; io.EOF (or the upstream's error) once the
// upstream ended.
func (b *bridge) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case m := <-b.out:
		return m, nil
	case <-b.done:
		select {
		case m := <-b.out:
			return m, nil
		default:
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		return nil, cmpError(b.readErr, io.EOF)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func cmpError(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

// ask sends a request of the bridge's own upstream and waits for its answer (within 30 s).
func (b *bridge) ask(ctx context.Context, method string, params any) (*jsonrpc.Response, error) {
	id, key := b.nextID()
	raw, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	ch, forget := b.waiting.expect(key)
	defer forget() // answered or not, nobody waits once ask returns
	if err := b.up.Write(ctx, &jsonrpc.Request{ID: id, Method: method, Params: raw}); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case r := <-ch:
		return r, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: no answer from upstream: %w", method, ctx.Err())
	case <-b.done:
		return nil, ErrUpstreamGone
	}
}

// read runs handle on every upstream message until the upstream ends.
func (b *bridge) read(handle func(jsonrpc.Message)) {
	for {
		msg, err := b.up.Read(context.Background())
		var bad *transport.BadLineError
		if errors.As(err, &bad) {
			continue
		}
		if err != nil {
			b.mu.Lock()
			b.readErr = err
			b.mu.Unlock()
			b.once.Do(func() { close(b.done) })
			return
		}
		if r, ok := msg.(*jsonrpc.Response); ok && (b.waiting.deliver(r) || ownLate(r)) {
			continue
		}
		handle(msg)
	}
}

// ownLate reports whether r answers a request of the bridge's own that no one waits for
// any more (ask gave up): dropped, it is nobody else's.
func ownLate(r *jsonrpc.Response) bool {
	id, ok := r.ID.Raw().(string)
	return ok && strings.HasPrefix(id, bridgeIDPrefix)
}

// Close closes the upstream connection.
func (b *bridge) Close() error {
	err := b.up.Close()
	b.once.Do(func() { close(b.done) })
	return err
}

// SessionID is the upstream's.
func (b *bridge) SessionID() string { return b.up.SessionID() }

// legacyUp serves stateless hosts over a 2025-11-25 upstream session (see above). An
// upstream request of a host's call in flight (elicitation/create, sampling/createMessage,
// roots/list) is put to the host as an input_required round of that call, with a
// requestState of the bridge's; the host's continuation answers the upstream's request, and
// the call's final answer goes out as the continuation's. An upstream request that belongs
// to no call it can tell (several calls in flight on a stdio upstream) is refused.
type legacyUp struct {
	bridge
	initOnce sync.Once
	initRes  json.RawMessage // the upstream's InitializeResult
	initErr  error

	lmu       sync.Mutex
	inflight  map[string]*legacyCall // idKey of a request sent upstream → it, until answered
	suspended map[string]*legacyCall // requestState → the call waiting for the host's input
	// finished holds the answers upstream gave to calls whose round was put to the host and
	// not yet continued (upstream gave up waiting for the input and answered anyway): the
	// continuation gets it, nothing is sent again. By requestState; order is oldest first.
	finished map[string]finishedCall
	order    []string // keys of finished, oldest first
	bytes    int      // of the answers in finished
}

// finishedCall is an answer legacyUp keeps for a continuation, and when it came.
type finishedCall struct {
	resp *jsonrpc.Response
	size int
	at   time.Time
}

// The answers legacyUp keeps for continuations are bounded: at most maxFinished of them,
// maxFinishedBytes in all, none older than DefaultRoundTimeout (a round the host did not
// continue by then is abandoned). Past a bound the oldest is forgotten, and its
// continuation is answered with an error the proxy records unknown (never failed).
const (
	maxFinished      = 1024
	maxFinishedBytes = 64 << 20
)

// legacyCall is a request sent upstream for a stateless host.
type legacyCall struct {
	id      jsonrpc.ID // the id it was sent under
	replyID jsonrpc.ID // the id its answer goes out with (a continuation's; valid when set)
	input   bool       // tools/call, prompts/get or resources/read: it may need the host's input
	asking  *jsonrpc.Request
	queued  []*jsonrpc.Request // upstream requests of it not yet put to the host
	state   string
}

// bridgeState begins the requestState of the bridge's own rounds.
const bridgeState = bridgeIDPrefix + "round:"

var _ mcp.Connection = (*legacyUp)(nil)

// newLegacyUp bridges stateless hosts to up, a connection to a 2025-11-25 upstream not yet
// initialized. It declares the elicitation, sampling and roots capabilities: their requests
// become rounds of the host's calls.
func newLegacyUp(up mcp.Connection) *legacyUp {
	l := &legacyUp{bridge: newBridge(up), inflight: map[string]*legacyCall{}, suspended: map[string]*legacyCall{},
		finished: map[string]finishedCall{}}
	go l.read(l.handle)
	return l
}

// initialize opens the upstream session once: initialize (declaring elicitation, sampling
// and roots), then notifications/initialized. A failure stays: the session's requests fail
// until its connection is opened again.
func (l *legacyUp) initialize(ctx context.Context) error {
	l.initOnce.Do(func() {
		r, err := l.ask(ctx, "initialize", map[string]any{"protocolVersion": transport.Rev20251125,
			"capabilities": map[string]any{"elicitation": map[string]any{}, "sampling": map[string]any{}, "roots": map[string]any{}},
			"clientInfo":   proxyInfo})
		switch {
		case err != nil:
			l.initErr = fmt.Errorf("initializing the upstream session: %w", err)
		case r.Error != nil:
			l.initErr = fmt.Errorf("initializing the upstream session: %w", r.Error)
		default:
			l.initRes = r.Result
			l.initErr = l.up.Write(ctx, &jsonrpc.Request{Method: "notifications/initialized", Params: json.RawMessage(`{}`)})
		}
	})
	return l.initErr
}

// Write sends msg upstream: server/discover is answered from the session's
// InitializeResult; a request's result will carry a resultType.
func (l *legacyUp) Write(ctx context.Context, msg jsonrpc.Message) error {
	if err := l.initialize(ctx); err != nil {
		if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
			l.emit(&jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: transport.CodeUpstreamHTTP,
				Message: "toolfence proxy: the upstream (2025-11-25) could not be initialized for a stateless host: " + err.Error()}})
			return nil
		}
		return err
	}
	req, ok := msg.(*jsonrpc.Request)
	if ok && req.Method == "server/discover" && req.IsCall() {
		l.emit(&jsonrpc.Response{ID: req.ID, Result: discoverFromInit(l.initRes)})
		return nil
	}
	if ok && req.IsCall() {
		if state := continuationState(req.Params); strings.HasPrefix(state, bridgeState) {
			return l.continued(ctx, req, state)
		}
		l.lmu.Lock()
		l.inflight[hostKey(req.ID)] = &legacyCall{id: req.ID,
			input: req.Method == "tools/call" || req.Method == "prompts/get" || req.Method == "resources/read"}
		l.lmu.Unlock()
	}
	if ok && transport.ReadMeta(req.Params).HasMeta {
		// In the upstream's revision: no stateless _meta (an HTTP upstream would take its
		// protocol version for the request's and refuse it).
		out := *req
		out.Params = transport.WithMeta(req.Params, map[string]any{transport.MetaProtocolVersion: nil,
			transport.MetaClientCapabilities: nil, transport.MetaClientInfo: nil, transport.MetaLogLevel: nil})
		msg = &out
	}
	return l.up.Write(ctx, msg)
}

// handle passes an upstream message on: a result with a resultType (and the id of the
// continuation it now answers); the upstream's ping is answered, its requests for a host's
// input become a round of the call they belong to, and its other requests are refused.
func (l *legacyUp) handle(msg jsonrpc.Message) {
	switch m := msg.(type) {
	case *jsonrpc.Response:
		l.lmu.Lock()
		c := l.inflight[hostKey(m.ID)]
		delete(l.inflight, hostKey(m.ID))
		if c != nil && c.state != "" {
			delete(l.suspended, c.state)
		}
		if c != nil && m.Result != nil {
			m.Result = withResultType(m.Result)
		}
		if c != nil && c.asking != nil {
			// The host was asked and has not answered: nobody waits under the call's ids.
			// Its continuation takes this answer (the call ran once; it must not run again).
			l.keepFinishedLocked(c.state, m)
			l.lmu.Unlock()
			return
		}
		l.lmu.Unlock()
		if c != nil && c.replyID.IsValid() {
			m.ID = c.replyID
		}
		l.emit(m)
	case *jsonrpc.Request:
		switch {
		case !m.IsCall():
			l.emit(m)
		case m.Method == "ping":
			_ = l.up.Write(context.Background(), &jsonrpc.Response{ID: m.ID, Result: json.RawMessage(`{}`)})
		case m.Method == "elicitation/create" || m.Method == "sampling/createMessage" || m.Method == "roots/list":
			if !l.round(m) {
				l.refuse(m, "it belongs to no host call the proxy can tell")
			}
		default:
			l.refuse(m, "a stateless host takes no requests")
		}
	}
}

// keepFinishedLocked keeps upstream's answer m to the call of the round state for its
// continuation, under l.lmu, forgetting the oldest answers past the bounds.
func (l *legacyUp) keepFinishedLocked(state string, m *jsonrpc.Response) {
	size := len(m.Result)
	if m.Error != nil {
		size += len(m.Error.Error())
	}
	now := time.Now()
	for len(l.order) > 0 {
		oldest, ok := l.finished[l.order[0]]
		if ok && len(l.finished) < maxFinished && l.bytes+size <= maxFinishedBytes && now.Sub(oldest.at) < DefaultRoundTimeout {
			break
		}
		l.forgetFinishedLocked(l.order[0])
		l.order = l.order[1:]
	}
	l.finished[state] = finishedCall{resp: m, size: size, at: now}
	l.bytes += size
	l.order = append(l.order, state)
}

// forgetFinishedLocked drops the answer kept for state, if any, under l.lmu (its place in
// order stays until it is the oldest).
func (l *legacyUp) forgetFinishedLocked(state string) {
	if f, ok := l.finished[state]; ok {
		l.bytes -= f.size
		delete(l.finished, state)
	}
}

// refuse answers an upstream request the bridge cannot put to a host.
func (l *legacyUp) refuse(m *jsonrpc.Request, why string) {
	_ = l.up.Write(context.Background(), &jsonrpc.Response{ID: m.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound,
		Message: "toolfence proxy: the host speaks " + transport.Rev20260728 + " (stateless) and cannot be sent " + m.Method + ": " + why}})
}

// round puts the upstream request m to the host as an input_required round of the call it
// belongs to (the request whose stream it came on, else the one call in flight that may
// take input); false when there is none.
func (l *legacyUp) round(m *jsonrpc.Request) bool {
	l.lmu.Lock()
	var c *legacyCall
	if id, ok := transport.RelatedRequest(m); ok {
		c = l.inflight[hostKey(id)]
	} else {
		for _, ic := range l.inflight {
			if ic.input {
				if c != nil {
					c = nil // more than one: ambiguous
					break
				}
				c = ic
			}
		}
	}
	if c == nil || !c.input {
		l.lmu.Unlock()
		return false
	}
	if c.asking != nil { // the host is answering another of its requests: this one waits
		c.queued = append(c.queued, m)
		l.lmu.Unlock()
		return true
	}
	c.asking = m
	if c.state == "" {
		c.state = bridgeState + newUpstreamSession() + newUpstreamSession()
		l.suspended[c.state] = c
	}
	reply := c.id
	if c.replyID.IsValid() {
		reply = c.replyID
	}
	l.lmu.Unlock()
	l.emit(&jsonrpc.Response{ID: reply, Result: inputRequiredOf(m, c.state)})
	return true
}

// inputRequiredOf is the input_required result asking the host upstream's request m.
func inputRequiredOf(m *jsonrpc.Request, state string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{
		"resultType":    resultInputRequired,
		"inputRequests": map[string]any{"upstream": map[string]any{"method": m.Method, "params": m.Params}},
		"requestState":  state,
	})
	return b
}

// continued takes a host's continuation of a round of the bridge's: its input answers the
// upstream's request, and the call's final answer (or its next round) goes out under the
// continuation's id. A continuation of a round the bridge no longer holds is refused.
func (l *legacyUp) continued(ctx context.Context, req *jsonrpc.Request, state string) error {
	l.lmu.Lock()
	c := l.suspended[state]
	if c == nil || c.asking == nil {
		done, ok := l.finished[state]
		l.forgetFinishedLocked(state)
		l.lmu.Unlock()
		if ok { // upstream finished the call before the host answered: its answer
			out := *done.resp
			out.ID = req.ID
			l.emit(&out)
			return nil
		}
		// Not invalid params: the round's call may have run upstream (the proxy records the
		// outcome unknown, never failed).
		l.emit(&jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeInternalError,
			Message: "toolfence proxy: requestState names no round in progress (it ended, or the proxy restarted); upstream may have run the call"}})
		return nil
	}
	asked := c.asking
	c.asking, c.replyID = nil, req.ID
	var next *jsonrpc.Request
	if len(c.queued) > 0 {
		next, c.queued = c.queued[0], c.queued[1:]
		c.asking = next
	}
	l.lmu.Unlock()
	var p struct {
		InputResponses map[string]json.RawMessage `json:"inputResponses"`
	}
	_ = json.Unmarshal(req.Params, &p)
	answer := &jsonrpc.Response{ID: asked.ID, Result: p.InputResponses["upstream"]}
	if answer.Result == nil {
		answer = &jsonrpc.Response{ID: asked.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "the host gave no answer"}}
	}
	if err := l.up.Write(ctx, answer); err != nil {
		return err
	}
	if next != nil {
		l.emit(&jsonrpc.Response{ID: req.ID, Result: inputRequiredOf(next, state)})
	}
	return nil
}

// continuationState is the requestState of a call's params ("" for none).
func continuationState(params json.RawMessage) string {
	if !strings.Contains(string(params), `"requestState"`) {
		return ""
	}
	var p struct {
		RequestState string `json:"requestState"`
	}
	_ = json.Unmarshal(params, &p)
	return p.RequestState
}

// discoverFromInit is a DiscoverResult made from an upstream's InitializeResult: its
// capabilities, serverInfo (in _meta) and instructions, the revisions the proxy serves.
func discoverFromInit(init json.RawMessage) json.RawMessage {
	var r struct {
		Capabilities json.RawMessage `json:"capabilities"`
		ServerInfo   json.RawMessage `json:"serverInfo"`
		Instructions string          `json:"instructions,omitempty"`
	}
	_ = json.Unmarshal(init, &r)
	out := map[string]any{
		"resultType":        resultComplete,
		"supportedVersions": []string{transport.Rev20260728, transport.Rev20251125},
		"capabilities":      cmpRaw(r.Capabilities, json.RawMessage(`{}`)),
		"ttlMs":             0,
		"cacheScope":        "private",
	}
	if r.Instructions != "" {
		out["instructions"] = r.Instructions
	}
	if len(r.ServerInfo) > 0 {
		out["_meta"] = map[string]any{transport.MetaServerInfo: r.ServerInfo}
	}
	b, _ := json.Marshal(out)
	return b
}

func cmpRaw(a, b json.RawMessage) json.RawMessage {
	if len(a) > 0 && string(a) != "null" {
		return a
	}
	return b
}

// probeDiscover asks conn, which nobody else reads yet, server/discover in the stateless
// revision and returns its answer (within 10 s); what else conn sends meanwhile comes back
// in extra, in order.
func probeDiscover(ctx context.Context, conn mcp.Connection) (resp *jsonrpc.Response, extra []jsonrpc.Message, err error) {
	id, _ := jsonrpc.MakeID(bridgeIDPrefix + "discover")
	params := transport.WithMeta(nil, map[string]any{transport.MetaProtocolVersion: transport.Rev20260728,
		transport.MetaClientCapabilities: map[string]any{}, transport.MetaClientInfo: proxyInfo})
	if err := conn.Write(ctx, &jsonrpc.Request{ID: id, Method: "server/discover", Params: params}); err != nil {
		return nil, nil, err
	}
	return readAnswer(ctx, conn, id, 10*time.Second)
}

// readAnswer reads conn, which nobody else reads yet, until the answer to id (within
// timeout); what else it reads meanwhile comes back in extra, in order.
func readAnswer(ctx context.Context, conn mcp.Connection, id jsonrpc.ID, timeout time.Duration) (*jsonrpc.Response, []jsonrpc.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var extra []jsonrpc.Message
	for {
		msg, err := conn.Read(ctx)
		var bad *transport.BadLineError
		if errors.As(err, &bad) {
			continue
		}
		if err != nil {
			return nil, extra, err
		}
		if r, ok := msg.(*jsonrpc.Response); ok && hostKey(r.ID) == hostKey(id) {
			return r, extra, nil
		}
		extra = append(extra, msg)
	}
}
