package mcpproxy

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// DefaultTimeout is how long the proxy waits for upstream's answer to a protected call.
const DefaultTimeout = 2 * time.Minute

// Options configure a Proxy.
type Options struct {
	// ServerID names the upstream server in operations (<ServerID>/<tool>). Required:
	// letters, digits, '.', '_' and '-', at most 64. Keep it stable: a new id is a new key space.
	ServerID string
	// Task is the task of calls whose request names none in _meta (mcpwire.MetaTask). Defaults to
	// DefaultTask(ServerID): the same across host and proxy restarts.
	Task string
	// Policy decides which tools are protected and how. Defaults to the zero Policy.
	Policy *policy.Policy
	// Timeout bounds the wait for upstream's answer to a protected call (a tool's policy may
	// set its own). Defaults to DefaultTimeout.
	Timeout time.Duration
	// Logger gets warnings (policy problems, calls keyed by an argument digest). Defaults to
	// discarding them.
	Logger *slog.Logger
	// Pins, when set, are the catalog pins (LoadPins): a protected tool whose definition
	// upstream differs from its pin, or has none, is refused (mcpwire.KindPin) and nothing is sent.
	// Nil: definitions are not checked.
	Pins *policy.Pins
	// RepeatWindow is the window of a tool whose policy repeats by window (the default
	// without target and key): a call identical to one that succeeded, soon after the host
	// had its answer, is a possible retry within it and a new intent after it (docs/proxy.md
	// "The same call again"). Defaults to DefaultRepeatWindow; negative: no window (every
	// such call is a new intent once the host had the earlier answer).
	RepeatWindow time.Duration
	// RoundTimeout is how long a protected call that upstream answered input_required (MCP
	// 2026-07-28 multi-round-trip requests) waits for the host to continue it before it is
	// abandoned and recorded failed. Defaults to DefaultRoundTimeout.
	RoundTimeout time.Duration
}

// DefaultTask returns the task of calls through a proxy for serverID when neither the call's
// _meta nor Options.Task names one: "mcp-proxy:<serverID>". It is stable across restarts, so
// a call repeated later with the same target and arguments is a replay, not a new effect.
func DefaultTask(serverID string) string { return "mcp-proxy:" + serverID }

// Proxy guards the tools/call requests of one upstream MCP server. It is safe for
// concurrent use; each Serve relays one host session.
type Proxy struct {
	ic     *interceptor.Interceptor
	cfg    Options
	log    *slog.Logger
	tracer trace.Tracer

	*memory // shared with the proxies of other namespaces (NewHTTPServer)
}

// memory is what a proxy learns about the upstream's tools over its life, shared by all its
// sessions (and, over HTTP, by the proxies of other namespaces).
type memory struct {
	warned      sync.Map       // tool name → struct{}: digest-target warning given
	protected   sync.Map       // tool name → struct{}: decided protected once, so protected for good
	reannotated sync.Map       // tool name → struct{}: an ignored re-annotation was logged
	rounds      rounds         // protected calls waiting for the host's next round (rounds.go)
	polls       polls          // when 2026-07-28 tasks may be asked about again (tasks.go)
	stateless   statelessLists // the tool lists of stateless HTTP hosts (toollist.go)
	seen        seen           // the answers hosts had and the calls that began (repeat.go)
	questions   questions      // questions asked stateless hosts' users (ask.go)
	logged      sync.Map       // what once logged: a warning given once per process
}

// once reports whether what has not been logged yet in this proxy's life (and marks it).
func (p *Proxy) once(what string) bool {
	_, seen := p.logged.LoadOrStore(what, struct{}{})
	return !seen
}

// New returns a proxy that guards calls with ic. It returns an error for a missing or
// malformed ServerID, a negative Timeout, or a policy lease not longer than ic's margin.
func New(ic *interceptor.Interceptor, cfg Options) (*Proxy, error) {
	if ic == nil {
		return nil, errors.New("mcpproxy: nil interceptor")
	}
	if err := policy.CheckServerID(cfg.ServerID); err != nil {
		return nil, err
	}
	if cfg.Timeout < 0 || cfg.RoundTimeout < 0 {
		return nil, fmt.Errorf("mcpproxy: timeout %v or round timeout %v is negative", cfg.Timeout, cfg.RoundTimeout)
	}
	cfg.RoundTimeout = cmp.Or(cfg.RoundTimeout, DefaultRoundTimeout)
	cfg.RepeatWindow = cmp.Or(cfg.RepeatWindow, DefaultRepeatWindow)
	cfg.Task = cmp.Or(cfg.Task, DefaultTask(cfg.ServerID))
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	if cfg.Policy == nil {
		cfg.Policy = &policy.Policy{}
	}
	if cfg.Pins != nil {
		if err := cfg.Pins.CheckServer(cfg.ServerID); err != nil {
			return nil, err
		}
	}
	if err := cfg.Policy.CheckLeases(ic.Settings().Margin); err != nil {
		return nil, err
	}
	// A tool whose upstream deduplicates by our key may be dispatched again over an unknown
	// outcome, under the same key: the interceptor's barrier decides that (Redispatch).
	for _, name := range cfg.Policy.Names() {
		if cfg.Policy.Tools[name].Key == nil {
			continue
		}
		op := cfg.ServerID + "/" + name
		reg := ic.Operation(op)
		reg.UpstreamIdempotent = true
		if err := ic.Register(op, reg); err != nil {
			return nil, policy.Errorf("tool %q: %w", name, err)
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Proxy{ic: ic, cfg: cfg, log: log, tracer: tracer(ic), memory: &memory{}}, nil
}

// clock is the interceptor's clock (the real one when it has none).
func (p *Proxy) clock() lease.Clock {
	if c := p.ic.Settings().Clock; c != nil {
		return c
	}
	return lease.Real{}
}

// Serve relays one host session: messages from down (the host) go to up (the upstream
// server) and back, untouched, except tools/call requests of protected tools, which pass
// the barrier. It returns when either side ends (nil for a clean EOF), after every guarded
// call in flight has been settled, and closes both connections.
func (p *Proxy) Serve(ctx context.Context, down, up mcp.Connection) error {
	return p.serve(ctx, down, up, false)
}

// serve is Serve; stateless says the session is one stateless HTTP request (its host's
// tool list is shared with other such requests, and its rounds outlive it).
func (p *Proxy) serve(ctx context.Context, down, up mcp.Connection, stateless bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &session{p: p, down: down, up: up,
		calls: map[string]context.CancelCauseFunc{}, relayed: map[string]trace.Span{}, late: map[string]string{}, dropped: map[string]struct{}{},
		upDone: make(chan struct{}), downDone: make(chan struct{}), stateless: stateless}
	s.upSess = newUpstreamSession()
	s.idSpace = ReservedIDPrefix + s.upSess + ":"
	upErr, downErr := make(chan error, 1), make(chan error, 1)
	s.readUp = func() { go func() { upErr <- s.readUpstream(ctx); close(s.upDone) }() }
	if stateless {
		s.decided = true // its upstream connection speaks the host's revision already
		s.readUp()
	}
	go func() { downErr <- s.readDownstream(ctx); close(s.downDone) }()
	var err error
	select {
	case err = <-downErr:
	case err = <-upErr:
		if err == nil || errors.Is(err, io.EOF) {
			// The upstream ending is never a clean end of the host's session.
			err = ErrUpstreamGone
		}
	case <-ctx.Done():
		// A reader the context cannot interrupt (a terminal, a file) stays blocked; the
		// session ends anyway.
		err = ctx.Err()
	}
	// From here on no new call starts (readDownstream may still hand one over); the calls
	// in flight are settled.
	s.mu.Lock()
	s.ending = true
	s.mu.Unlock()
	s.wg.Wait()
	// The host of this session can no longer continue a multi-round call it began here.
	s.p.abandonRounds(s, "the host's session ended")
	cancel()
	s.mu.Lock()
	for _, span := range s.relayed {
		if span != nil {
			endCall(span, nil) // the session ended before upstream answered
		}
	}
	s.relayed = nil
	s.mu.Unlock()
	_ = down.Close()
	s.mu.Lock()
	b := s.bridged
	s.mu.Unlock()
	if b != nil {
		_ = b.Close() // and the upstream's own connection under it
	} else {
		_ = up.Close()
	}
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// ErrUpstreamGone is Serve's error when the upstream server ended the session (a stdio
// child exited or closed its stdout, an HTTP upstream closed it).
var ErrUpstreamGone = errors.New("mcpproxy: the upstream server closed the connection")

// session is the state of one Serve.
type session struct {
	p        *Proxy
	down, up mcp.Connection
	wg       sync.WaitGroup
	seq      atomic.Uint64
	upSess   string // the upstream session's random id (newUpstreamSession)
	idSpace  string // prefix of the proxy's own upstream request ids: "toolfence-proxy:<upSess>:"
	upDone   chan struct{}
	downDone chan struct{} // closed when the host's side ended (readDownstream returned)
	decided  bool          // the upstream connection is set for the host's revision (link.go); readDownstream's
	readUp   func()        // starts reading the upstream (once decided)

	mu          sync.Mutex
	waiting     replies                            // the proxy's own requests, by id
	calls       map[string]context.CancelCauseFunc // host id of a guarded call → its cancel
	relayed     map[string]trace.Span              // host id of a request relayed upstream → its span (nil but for a bypassed call), until upstream answers
	dropped     map[string]struct{}                // host ids whose upstream answer was dropped and logged (at most maxDropped)
	droppedMore int                                // answers dropped once dropped was full (logged at powers of two)
	late        map[string]string                  // our id of a guarded call given up on → its key (at most maxLate)
	cat         *toolList                          // the upstream's tools as this session's host sees them (toollist.go)
	ending      bool                               // Serve is ending: no new call starts (wg.Add only while false, under mu)
	upRev       string                             // the upstream conversation's revision when stateless, else "" (revision.go)
	hostRev     string                             // the host\'s revision when stateless, else ""
	hostInfo    json.RawMessage                    // the host\'s clientInfo (initialize\'s, or its latest stateless request\'s)
	hostCaps    json.RawMessage                    // the host's client capabilities (initialize's, or its latest stateless request's)
	initID      string                             // hostKey of the host's initialize until upstream answers it (known.go)
	upName      string                             // the upstream's serverInfo name from that answer (known.go)
	stateless   bool                               // one stateless HTTP request: its host continues in other requests
	bridged     io.Closer                          // the bridge decide put over the upstream's connection, if any (link.go)
}

func (s *session) readDownstream(ctx context.Context) error {
	for {
		msg, err := s.down.Read(ctx)
		var bad *transport.BadLineError
		if errors.As(err, &bad) {
			// As the official SDKs' stdio servers do, the session ends: a request in that
			// line could not be answered (no id can be read from it).
			return fmt.Errorf("mcpproxy: the host sent a line that is not a JSON-RPC message: %w (line %q)", err, bad.Head())
		}
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err // the session ended while this message was read: nothing is relayed
		}
		if !s.decided {
			handled, err := s.decide(ctx, msg)
			if err != nil {
				return err
			}
			if handled {
				continue
			}
		}
		if req, ok := msg.(*jsonrpc.Request); ok {
			if req.IsCall() && req.Method != "tools/call" {
				s.noteHost(req, transport.ReadMeta(req.Params))
			}
			switch {
			case req.IsCall() && reservedID(req.ID):
				// Its answer could be taken for the answer of one of the proxy's own requests.
				s.p.log.Warn("toolfence proxy: host request refused: its id uses the proxy's reserved prefix", "method", req.Method, "id", req.ID.Raw())
				if err := s.down.Write(ctx, &jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: codeInvalidRequest,
					Message: fmt.Sprintf("toolfence proxy: invalid request: ids starting with %q are reserved for the proxy's own upstream requests; nothing was relayed", ReservedIDPrefix)}}); err != nil {
					return err
				}
				continue
			case req.Method == "notifications/cancelled" && cancelsReserved(req):
				continue // the host cannot cancel the proxy's own requests
			case req.Method == "tools/call" && req.IsCall():
				if !s.starting() {
					return ctx.Err() // Serve is ending: the call is not started, nothing is sent
				}
				c := parseCall(req)
				s.noteHost(req, c.meta())
				if s.relayIfBypassed(ctx, c) {
					s.wg.Done()
					continue
				}
				go s.call(ctx, c)
				continue
			case req.Method == "notifications/cancelled" && s.cancelled(req):
				continue
			}
		}
		if resp, ok := msg.(*jsonrpc.Response); ok && reservedID(resp.ID) {
			s.waiting.deliver(resp) // the host's answer to the proxy's own request (an elicitation)
			continue
		}
		if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
			s.relaying(req.ID, nil) // before it is sent: upstream may answer at once
		}
		if err := s.up.Write(ctx, msg); err != nil {
			return err
		}
	}
}

// relaying records a host request relayed upstream as in flight, with the span of a
// bypassed call (nil for any other request): upstream's answer to it is relayed once.
func (s *session) relaying(id jsonrpc.ID, span trace.Span) {
	k := hostKey(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.relayed == nil { // Serve has ended the session: nothing will answer it
		if span != nil {
			endCall(span, nil)
		}
		return
	}
	s.relayed[k] = span
	delete(s.dropped, k) // a new request: a forged answer to it is logged again
}

// maxDropped bounds the host ids whose dropped answers a session remembers having logged.
const maxDropped = 256

// dropAnswer logs, once per id, an upstream answer that no relayed host request in flight
// waits for: an id upstream made up, one of a protected call (the proxy sent that call under
// its own id, so only the proxy's answer may reach the host), or a second or late answer.
func (s *session) dropAnswer(id jsonrpc.ID) {
	k := hostKey(id)
	s.mu.Lock()
	_, logged := s.dropped[k]
	full := len(s.dropped) >= maxDropped
	if !logged && !full {
		s.dropped[k] = struct{}{}
	}
	s.droppedMore += b2i(!logged && full)
	more := s.droppedMore
	s.mu.Unlock()
	switch {
	case !logged && !full:
		s.p.log.Warn("toolfence proxy: an upstream answer was dropped: no relayed host request waits for it",
			"server", s.p.cfg.ServerID, "id", id.Raw())
	case !logged && more&(more-1) == 0: // past the ids logged one by one: at 1, 2, 4, 8… more
		s.p.log.Warn("toolfence proxy: upstream answers were dropped: no relayed host request waits for them",
			"server", s.p.cfg.ServerID, "more", more)
	}
}

// b2i is 1 for true, 0 for false.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (s *session) readUpstream(ctx context.Context) error {
	for {
		msg, err := s.up.Read(ctx)
		var bad *transport.BadLineError
		if errors.As(err, &bad) {
			// A stdio server that prints something else on stdout (a banner, a log line):
			// the line is dropped and the session goes on. Were it the answer to a call in
			// flight, that call ends at its timeout as unknown, never as succeeded.
			s.p.log.Warn("toolfence proxy: upstream wrote a line that is not a JSON-RPC message; it was dropped (a server must write only JSON-RPC on stdout)",
				"err", err, "line", bad.Head())
			continue
		}
		if err != nil {
			return err
		}
		var answered trace.Span // the span of the bypassed call msg answers
		switch m := msg.(type) {
		case *jsonrpc.Response:
			if s.waiting.deliver(m) {
				continue
			}
			if reservedID(m.ID) {
				// An answer to one of the proxy's own requests that no one waits for any more
				// (it timed out, was cancelled): never the host's (its ids in the reserved
				// space are refused), so it is dropped, not relayed. For a guarded call it is
				// the evidence its unknown outcome needs: logged with the key and what it says.
				id, _ := m.ID.Raw().(string)
				s.mu.Lock()
				key := s.late[id]
				delete(s.late, id)
				s.mu.Unlock()
				attrs := []any{"id", id}
				if key != "" {
					rep := classify(policy.NoEffect{}, m, nil)
					attrs = append(attrs, "key", key, "answer", string(rep.Outcome), "detail", rep.Error,
						"recovery", "check upstream, then toolfence resolve "+key+" --as succeeded|failed")
				}
				s.p.log.Warn("toolfence proxy: upstream's late answer to the proxy's own request was dropped: the proxy no longer waits for it", attrs...)
				continue
			}
			s.mu.Lock()
			span, inFlight := s.relayed[hostKey(m.ID)]
			delete(s.relayed, hostKey(m.ID))
			s.mu.Unlock()
			if !inFlight {
				s.dropAnswer(m.ID)
				continue
			}
			s.noteUpstream(m)
			answered = span
		case *jsonrpc.Request:
			if m.Method == "notifications/tools/list_changed" {
				s.toolList().reset()
				s.p.stateless.resetAll() // the same upstream: stateless hosts' lists are stale too
			}
		}
		if answered != nil {
			endCall(answered, msg.(*jsonrpc.Response))
		}
		if err := s.relayUp(ctx, msg); err != nil {
			return err
		}
	}
}

// starting counts a host's tools/call in the calls Serve waits for, unless Serve is ending
// (false: the call must not start). A call that starts is settled before Serve returns.
func (s *session) starting() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ending {
		return false
	}
	s.wg.Add(1)
	return true
}

// relayUp passes a message of the upstream on to the host: as upstream wrote it when both
// sides are stdio lines, else re-encoded. (Nothing the proxy decides depends on the bytes
// of an upstream message it relays, so the host may see upstream's own; a host's message is
// always re-encoded, so that upstream sees exactly what the proxy judged.)
func (s *session) relayUp(ctx context.Context, msg jsonrpc.Message) error {
	if ok, err := transport.RelayRaw(ctx, s.down, s.up); ok {
		return err
	}
	return s.down.Write(ctx, msg)
}

// ReservedIDPrefix begins the id of every request the proxy itself sends upstream
// (tools/list, probes, tasks/get, guarded tools/call): "toolfence-proxy:<random per
// session>:<n>". A host request whose id is a string with this prefix is refused with
// JSON-RPC error -32600 (invalid request) and nothing is relayed, so no host request can be
// answered with the answer of the proxy's own; and an upstream answer in this space that no
// one waits for any more (a request that timed out or was cancelled) is dropped, never
// relayed to the host.
const ReservedIDPrefix = "toolfence-proxy:"

// codeInvalidRequest is JSON-RPC's invalid request error code.
const codeInvalidRequest = -32600

// reservedID says whether a host's request id is in the proxy's own id space.
func reservedID(id jsonrpc.ID) bool {
	s, ok := id.Raw().(string)
	return ok && strings.HasPrefix(s, ReservedIDPrefix)
}

// cancelsReserved says whether a notifications/cancelled names a request id in the proxy's
// own id space.
func cancelsReserved(req *jsonrpc.Request) bool {
	var params struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(req.Params, &params) != nil {
		return false
	}
	s, ok := params.RequestID.(string)
	return ok && strings.HasPrefix(s, ReservedIDPrefix)
}

// newUpstreamSession returns 16 random hex digits naming one upstream session (one Serve):
// the random part of the proxy's own request ids ("toolfence-proxy:<it>:<n>"), so a host
// cannot predict them, and the prefix of the task handles it records ("<it>/<taskId>"), so a
// task id is only ever asked about in the upstream session that issued it.
func newUpstreamSession() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("mcpproxy: crypto/rand: " + err.Error()) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b[:])
}

// hostKey identifies a host's request id (numbers and strings apart).
func hostKey(id jsonrpc.ID) string { return fmt.Sprintf("%T:%v", id.Raw(), id.Raw()) }

// cancelled ends the guarded call a host's notifications/cancelled names, and reports
// whether it named one (the proxy then sends its own cancellation upstream). A relayed
// request it names is no longer in flight: its late answer, if upstream sends one, is
// dropped, and the notification is relayed.
func (s *session) cancelled(req *jsonrpc.Request) bool {
	var params struct {
		RequestID any    `json:"requestId"`
		Reason    string `json:"reason"`
	}
	if json.Unmarshal(req.Params, &params) != nil {
		return false
	}
	id, err := jsonrpc.MakeID(params.RequestID)
	if err != nil {
		return false
	}
	k := hostKey(id)
	s.mu.Lock()
	cancel := s.calls[k]
	if span, ok := s.relayed[k]; ok && cancel == nil {
		// A relayed request the host gave up on: upstream need not answer it (and a late
		// answer is dropped), so it is no longer in flight; the cancellation goes upstream.
		delete(s.relayed, k)
		if span != nil {
			endCall(span, nil)
		}
	}
	s.mu.Unlock()
	if cancel == nil {
		return false
	}
	cancel(fmt.Errorf("the host cancelled the call (%s)", cmp.Or(params.Reason, "no reason given")))
	return true
}

// replies routes the answers to requests of the proxy's own (to the host or upstream) to
// the caller waiting for each, by id. The zero value is ready.
type replies struct {
	mu      sync.Mutex
	waiting map[string]chan *jsonrpc.Response
}

// expect registers a request id and returns the channel its answer will come on, and
// forget, which stops waiting for it.
func (r *replies) expect(id string) (answer <-chan *jsonrpc.Response, forget func()) {
	ch := make(chan *jsonrpc.Response, 1)
	r.mu.Lock()
	if r.waiting == nil {
		r.waiting = map[string]chan *jsonrpc.Response{}
	}
	r.waiting[id] = ch
	r.mu.Unlock()
	return ch, func() {
		r.mu.Lock()
		delete(r.waiting, id)
		r.mu.Unlock()
	}
}

// deliver hands m to the caller waiting for its id, once; false when no one waits (the
// caller then drops or relays m).
func (r *replies) deliver(m *jsonrpc.Response) bool {
	id, ok := m.ID.Raw().(string)
	if !ok {
		return false
	}
	r.mu.Lock()
	ch := r.waiting[id]
	delete(r.waiting, id)
	r.mu.Unlock()
	if ch == nil {
		return false
	}
	ch <- m
	return true
}

// ownRequest takes a new id of the proxy's own (in the session's id space) and the channel
// its answer will come on; forget stops waiting for it.
func (s *session) ownRequest() (id jsonrpc.ID, idText string, answer <-chan *jsonrpc.Response, forget func()) {
	idText = s.idSpace + strconv.FormatUint(s.seq.Add(1), 10)
	id, _ = jsonrpc.MakeID(idText)
	answer, forget = s.waiting.expect(idText)
	return id, idText, answer, forget
}

// requestHost sends one request of the proxy's own to the host (an elicitation) and waits
// for its answer, until ctx ends (a notifications/cancelled is then sent to the host) or
// the session ends.
func (s *session) requestHost(ctx context.Context, method string, params json.RawMessage) (*jsonrpc.Response, error) {
	id, idText, ch, forget := s.ownRequest()
	if err := s.down.Write(context.WithoutCancel(ctx), &jsonrpc.Request{ID: id, Method: method, Params: params}); err != nil {
		forget()
		return nil, fmt.Errorf("sending %s to the host: %w", method, err)
	}
	select {
	case r := <-ch:
		return r, nil
	case <-ctx.Done():
		forget()
		note, _ := json.Marshal(map[string]any{"requestId": idText, "reason": "toolfence proxy: " + context.Cause(ctx).Error()})
		_ = s.down.Write(context.WithoutCancel(ctx), &jsonrpc.Request{Method: "notifications/cancelled", Params: note})
		return nil, context.Cause(ctx)
	case <-s.downDone:
		forget()
		return nil, errors.New("the host's session ended")
	}
}

// roundTrip sends one request of the proxy's own upstream, in the upstream conversation's
// revision (ownParams), and waits for its answer. A nil
// response comes with the reason it never came: ctx ended (a cancellation is sent
// upstream), the upstream is gone, or the request could not be written.
func (s *session) roundTrip(ctx context.Context, method string, params json.RawMessage) (*jsonrpc.Response, error) {
	return s.roundTripFor(ctx, "", method, s.ownParams(params))
}

// maxLate bounds the ids of guarded calls given up on (session.late) that a session keeps.
const maxLate = 256

// roundTripFor is roundTrip for the dispatch of the guarded call key: when ctx ends first,
// the request's id is kept with key, so that upstream's late answer, which is dropped, is
// logged with the key it settles (the evidence a person needs to resolve it).
func (s *session) roundTripFor(ctx context.Context, key, method string, params json.RawMessage) (*jsonrpc.Response, error) {
	id, idText, ch, forget := s.ownRequest()
	if err := s.up.Write(context.WithoutCancel(ctx), &jsonrpc.Request{ID: id, Method: method, Params: params}); err != nil {
		forget()
		return nil, fmt.Errorf("sending %s upstream: %w", method, err)
	}
	select {
	case r := <-ch:
		return r, nil
	case <-ctx.Done():
		forget()
		if key != "" {
			s.mu.Lock()
			if len(s.late) >= maxLate {
				for id := range s.late { // any one: the bound only keeps a lost session small
					delete(s.late, id)
					break
				}
			}
			s.late[idText] = key
			s.mu.Unlock()
		}
		cause := context.Cause(ctx)
		note, _ := json.Marshal(map[string]any{"requestId": idText, "reason": "toolfence proxy: " + cause.Error()})
		_ = s.up.Write(context.WithoutCancel(ctx), &jsonrpc.Request{Method: "notifications/cancelled", Params: note})
		return nil, cause
	case <-s.upDone:
		forget()
		return nil, ErrUpstreamGone
	}
}
