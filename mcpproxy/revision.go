package mcpproxy

import (
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// What a session knows of the protocol revision its two sides speak. Relayed unchanged, a
// session's upstream conversation is in the host's revision: a 2025-11-25 host initializes
// it, a 2026-07-28 host sends every request with its revision and capabilities in _meta.
// The proxy's own requests (the catalog, probes, tasks/get) must then speak the same: in a
// stateless conversation each carries the revision and the host's capabilities (so the
// catalog lists what the host may call) in its _meta.

// proxyInfo is the clientInfo the proxy's own stateless requests carry.
var proxyInfo = map[string]string{"name": "toolfence-proxy", "version": "1"}

// noteHost learns the host's revision from one of its requests: initialize begins a
// session conversation (capabilities from its params); a request with a stateless revision
// in _meta makes the conversation stateless, with that request's capabilities.
func (s *session) noteHost(req *jsonrpc.Request, meta transport.RequestMeta) {
	if req.Method == "initialize" {
		var p struct {
			Capabilities json.RawMessage `json:"capabilities"`
			ClientInfo   json.RawMessage `json:"clientInfo"`
		}
		_ = json.Unmarshal(req.Params, &p)
		s.mu.Lock()
		s.upRev, s.hostRev, s.hostCaps, s.hostInfo = "", "", p.Capabilities, p.ClientInfo
		s.initID = hostKey(req.ID) // its answer names the upstream server (noteUpstream)
		s.mu.Unlock()
		return
	}
	if !transport.Stateless(meta.Version) {
		return
	}
	s.mu.Lock()
	s.upRev, s.hostRev = meta.Version, meta.Version
	if meta.Capabilities != nil {
		s.hostCaps = meta.Capabilities
	}
	if meta.ClientInfo != nil {
		s.hostInfo = meta.ClientInfo
	}
	s.mu.Unlock()
}

// hostName is the name the host gave in its clientInfo ("" when it gave none).
func (s *session) hostName() string {
	s.mu.Lock()
	info := s.hostInfo
	s.mu.Unlock()
	var i struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(info, &i)
	return i.Name
}

// hostRevision is the host's revision when it is stateless, else "".
func (s *session) hostRevision() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hostRev
}

// withResultType returns result (a JSON object) with resultType "complete" when it has
// none; anything else unchanged.
func withResultType(result json.RawMessage) json.RawMessage {
	if rt, ok := transport.ResultType(result); ok && rt != resultComplete {
		return result // it has one
	}
	var doc map[string]json.RawMessage
	if json.Unmarshal(result, &doc) != nil || doc == nil {
		return result
	}
	if _, ok := doc["resultType"]; ok {
		return result
	}
	doc["resultType"] = json.RawMessage(`"complete"`)
	out, err := json.Marshal(doc)
	if err != nil {
		return result
	}
	return out
}

// ownParams returns the params of a request of the proxy's own in the upstream
// conversation's revision: unchanged in a session, with the revision, the host's
// capabilities and the proxy's clientInfo in _meta when it is stateless (params that carry
// a revision already, a host's, are left as they are).
func (s *session) ownParams(params json.RawMessage) json.RawMessage {
	s.mu.Lock()
	rev, caps := s.upRev, s.hostCaps
	s.mu.Unlock()
	if !transport.Stateless(rev) || transport.ReadMeta(params).Version != "" {
		return params
	}
	if len(caps) == 0 {
		caps = json.RawMessage(`{}`)
	}
	return transport.WithMeta(params, map[string]any{
		transport.MetaProtocolVersion:    rev,
		transport.MetaClientCapabilities: caps,
		transport.MetaClientInfo:         proxyInfo,
	})
}

// taskScoper is an upstream connection that knows the scope of the task ids its server
// issues (transport's stateless HTTP connection: the server, not a session).
type taskScoper interface{ TaskScope() string }

// handleScope is the scope of the task handles this session records: the connection's own
// (taskScoper) when it has one, else its upstream session's random id (a stdio child, an
// HTTP session).
func (s *session) handleScope() string {
	if sc, ok := s.up.(taskScoper); ok {
		if scope := sc.TaskScope(); scope != "" {
			return scope
		}
	}
	return s.upSess
}
