package mcpproxy

import (
	"context"
	"encoding/json"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// The bridge of a 2025-11-25 host session to a 2026-07-28-only upstream (bridge.go says
// what both bridges do).

// statelessUp serves a 2025-11-25 host session over a 2026-07-28-only upstream (bridge.go).
type statelessUp struct {
	bridge

	smu     sync.Mutex
	caps    json.RawMessage // the host's, from initialize
	info    json.RawMessage
	level   string
	pending map[string]*bridgedCall // idKey of a call in flight → what to send again after input_required
	toHost  map[string]*bridgedCall // own request id sent to the host → the call it answers for
}

// bridgedCall is a host call that may come back input_required: its request, and the
// answers collected for the current round.
type bridgedCall struct {
	req       *jsonrpc.Request
	keys      map[string]string          // own request id → input request key
	responses map[string]json.RawMessage // input request key → the host's result
	state     string
	rounds    int
}

var _ mcp.Connection = (*statelessUp)(nil)

// newStatelessUp bridges a session host to up, a connection to a stateless-only upstream.
func newStatelessUp(up mcp.Connection) *statelessUp {
	s := &statelessUp{bridge: newBridge(up), pending: map[string]*bridgedCall{}, toHost: map[string]*bridgedCall{}}
	go s.read(s.handle)
	return s
}

// maxBridgedRounds bounds the input_required rounds of one bridged call.
const maxBridgedRounds = 10

// meta is the _meta a request carries upstream for the host.
func (s *statelessUp) meta() map[string]any {
	s.smu.Lock()
	defer s.smu.Unlock()
	m := map[string]any{
		transport.MetaProtocolVersion:    transport.Rev20260728,
		transport.MetaClientCapabilities: cmpRaw(s.caps, json.RawMessage(`{}`)),
	}
	if len(s.info) > 0 {
		m[transport.MetaClientInfo] = s.info
	}
	if s.level != "" {
		m[transport.MetaLogLevel] = s.level
	}
	return m
}

// Write takes a message of the proxy (the host's, relayed, or the proxy's own).
func (s *statelessUp) Write(ctx context.Context, msg jsonrpc.Message) error {
	switch m := msg.(type) {
	case *jsonrpc.Response:
		s.hostAnswer(ctx, m)
		return nil
	case *jsonrpc.Request:
		switch {
		case m.Method == "initialize" && m.IsCall():
			return s.initialize(ctx, m)
		case m.Method == "notifications/initialized":
			return nil
		case m.Method == "ping" && m.IsCall():
			s.emit(&jsonrpc.Response{ID: m.ID, Result: json.RawMessage(`{}`)})
			return nil
		case m.Method == "logging/setLevel" && m.IsCall():
			var p struct {
				Level string `json:"level"`
			}
			_ = json.Unmarshal(m.Params, &p)
			s.smu.Lock()
			s.level = p.Level
			s.smu.Unlock()
			s.emit(&jsonrpc.Response{ID: m.ID, Result: json.RawMessage(`{}`)})
			return nil
		case m.Method == "notifications/cancelled":
			s.cancelled(m)
			return s.up.Write(ctx, m)
		case m.IsCall():
			out := *m
			if transport.ReadMeta(m.Params).Version == "" {
				out.Params = transport.WithMeta(m.Params, s.meta())
			}
			s.smu.Lock()
			s.pending[hostKey(m.ID)] = &bridgedCall{req: &out}
			s.smu.Unlock()
			return s.up.Write(ctx, &out)
		default:
			return s.up.Write(ctx, m)
		}
	}
	return nil
}

// initialize answers the host's initialize from the upstream's server/discover.
func (s *statelessUp) initialize(ctx context.Context, req *jsonrpc.Request) error {
	var p struct {
		ProtocolVersion string          `json:"protocolVersion"`
		Capabilities    json.RawMessage `json:"capabilities"`
		ClientInfo      json.RawMessage `json:"clientInfo"`
	}
	_ = json.Unmarshal(req.Params, &p)
	s.smu.Lock()
	s.caps, s.info = p.Capabilities, p.ClientInfo
	s.smu.Unlock()
	go func() {
		r, err := s.ask(context.WithoutCancel(ctx), "server/discover", map[string]any{"_meta": s.meta()})
		switch {
		case err != nil:
			s.emit(&jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: transport.CodeUpstreamHTTP, Message: "toolfence proxy: server/discover upstream: " + err.Error()}})
		case r.Error != nil:
			s.emit(&jsonrpc.Response{ID: req.ID, Error: r.Error})
		default:
			s.emit(&jsonrpc.Response{ID: req.ID, Result: initFromDiscover(r.Result, p.ProtocolVersion)})
		}
	}()
	return nil
}

// initFromDiscover is an InitializeResult made from a DiscoverResult: the host's revision
// when it is one the proxy serves a session in (else 2025-11-25), the upstream's
// capabilities, serverInfo and instructions.
func initFromDiscover(d json.RawMessage, asked string) json.RawMessage {
	var r struct {
		Capabilities json.RawMessage            `json:"capabilities"`
		Instructions string                     `json:"instructions,omitempty"`
		Meta         map[string]json.RawMessage `json:"_meta"`
	}
	_ = json.Unmarshal(d, &r)
	version := transport.Rev20251125
	switch asked {
	case "2025-06-18", "2025-03-26", "2024-11-05":
		version = asked
	}
	out := map[string]any{"protocolVersion": version, "capabilities": cmpRaw(r.Capabilities, json.RawMessage(`{}`)),
		"serverInfo": cmpRaw(r.Meta[transport.MetaServerInfo], json.RawMessage(`{"name":"upstream","version":"unknown"}`))}
	if r.Instructions != "" {
		out["instructions"] = r.Instructions
	}
	b, _ := json.Marshal(out)
	return b
}

// handle passes an upstream message on; an input_required answer to a call in flight
// becomes the host's requests for its inputs (hostRequests).
func (s *statelessUp) handle(msg jsonrpc.Message) {
	r, ok := msg.(*jsonrpc.Response)
	if !ok {
		s.emit(msg)
		return
	}
	k := hostKey(r.ID)
	s.smu.Lock()
	c := s.pending[k]
	s.smu.Unlock()
	if c == nil || !inputRequired(r) || c.rounds >= maxBridgedRounds {
		s.smu.Lock()
		delete(s.pending, k)
		s.smu.Unlock()
		s.emit(r)
		return
	}
	var ir struct {
		InputRequests map[string]struct {
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		} `json:"inputRequests"`
		RequestState string `json:"requestState"`
	}
	_ = json.Unmarshal(r.Result, &ir)
	s.smu.Lock()
	c.rounds++
	c.state, c.keys, c.responses = ir.RequestState, map[string]string{}, map[string]json.RawMessage{}
	var reqs []*jsonrpc.Request
	for key, in := range ir.InputRequests {
		id, idText := s.nextID()
		c.keys[idText] = key
		s.toHost[idText] = c
		reqs = append(reqs, &jsonrpc.Request{ID: id, Method: in.Method, Params: in.Params})
	}
	s.smu.Unlock()
	if len(reqs) == 0 { // load shedding: send it again as it was
		s.again(c)
		return
	}
	for _, q := range reqs {
		s.emit(q) // the proxy relays it to the host, whose answer comes back to Write
	}
}

// cancelled forgets the call a cancellation names (the proxy's or the host's): whoever sent
// it no longer waits for its answer, so a late answer of the host to one of its rounds
// sends nothing upstream again (again would run it outside the guard's attempt).
func (s *statelessUp) cancelled(m *jsonrpc.Request) {
	id, ok := transport.CancelledID(m.Params)
	if !ok {
		return
	}
	s.smu.Lock()
	defer s.smu.Unlock()
	c := s.pending[hostKey(id)]
	if c == nil {
		return
	}
	delete(s.pending, hostKey(id))
	for k, tc := range s.toHost {
		if tc == c {
			delete(s.toHost, k)
		}
	}
}

// hostAnswer takes the host's answer to one of the bridge's requests; once every input of
// the round is answered, the call goes upstream again with them.
func (s *statelessUp) hostAnswer(ctx context.Context, r *jsonrpc.Response) {
	idText, ok := r.ID.Raw().(string)
	if !ok {
		return
	}
	s.smu.Lock()
	c := s.toHost[idText]
	delete(s.toHost, idText)
	if c == nil {
		s.smu.Unlock()
		if !strings.HasPrefix(idText, bridgeIDPrefix) { // a round of a call given up: dropped
			_ = s.up.Write(ctx, r) // not the bridge's: upstream's own (there are none in 2026-07-28)
		}
		return
	}
	key := c.keys[idText]
	if r.Error != nil {
		errJSON, _ := json.Marshal(r.Error)
		c.responses[key] = errJSON
	} else {
		c.responses[key] = r.Result
	}
	complete := len(c.responses) == len(c.keys)
	s.smu.Unlock()
	if complete {
		s.again(c)
	}
}

// again sends call c upstream again with the answers of its round and its requestState,
// unless c was cancelled meanwhile.
func (s *statelessUp) again(c *bridgedCall) {
	s.smu.Lock()
	if s.pending[hostKey(c.req.ID)] != c {
		s.smu.Unlock()
		return
	}
	var doc map[string]json.RawMessage
	_ = json.Unmarshal(c.req.Params, &doc)
	if doc == nil {
		doc = map[string]json.RawMessage{}
	}
	doc["inputResponses"], _ = json.Marshal(c.responses)
	if c.state != "" {
		doc["requestState"], _ = json.Marshal(c.state)
	} else {
		delete(doc, "requestState")
	}
	params, _ := json.Marshal(doc)
	out := *c.req
	out.Params = params
	s.smu.Unlock()
	if err := s.up.Write(context.Background(), &out); err != nil {
		s.smu.Lock()
		delete(s.pending, hostKey(c.req.ID))
		s.smu.Unlock()
		s.emit(&jsonrpc.Response{ID: c.req.ID, Error: &jsonrpc.Error{Code: transport.CodeUpstreamHTTP, Message: "toolfence proxy: sending the call again with its inputs: " + err.Error()}})
	}
}
