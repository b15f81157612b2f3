package mcpproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// decide sets the session's upstream connection from the host's first message, before
// anything is read from the upstream (bridge.go): the upstream's own when it serves the
// host's revision, else a bridge over it; then starts reading it. A stateless host's first
// request is preceded by a server/discover of the proxy's own; a 2025-11-25 host's
// initialize is relayed, and when the upstream refuses it and its server/discover lists only
// stateless revisions, the host is answered through a bridge. handled reports whether
// decide relayed msg itself (the initialize).
func (s *session) decide(ctx context.Context, msg jsonrpc.Message) (handled bool, err error) {
	s.decided = true
	var early []jsonrpc.Message // what upstream sent while decide read it, for the host
	defer func() {
		s.readUp()
		for _, m := range early {
			if werr := s.down.Write(ctx, m); werr != nil && err == nil {
				err = werr
			}
		}
	}()
	req, ok := msg.(*jsonrpc.Request)
	if !ok || !req.IsCall() {
		return false, nil
	}
	if req.Method == "initialize" {
		return s.decideSession(ctx, req, &early)
	}
	if !transport.Stateless(transport.ReadMeta(req.Params).Version) && req.Method != "server/discover" {
		return false, nil
	}
	d, extra, err := probeDiscover(ctx, s.up)
	early = append(early, extra...)
	if gone(err) {
		return true, fmt.Errorf("%w (%v)", ErrUpstreamGone, err)
	}
	if err != nil || supportsStateless(d) {
		if err == nil {
			s.nameUpstream(discoveredName(d.Result))
		}
		return false, nil // it speaks the host's revision (or cannot say: relayed as is)
	}
	s.p.log.Info("toolfence proxy: the upstream does not speak the host's stateless revision; bridging to a session of the proxy's own",
		"server", s.p.cfg.ServerID)
	b := newLegacyUp(s.up)
	s.setBridge(b)
	if b.initialize(ctx) == nil {
		s.nameUpstream(initName(b.initRes))
	}
	return false, nil
}

// nameUpstream records the upstream server's name (known.go), once it is known.
func (s *session) nameUpstream(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name != "" {
		s.upName = name
	}
}

// discoveredName is the serverInfo name a DiscoverResult gives in its _meta.
func discoveredName(d json.RawMessage) string {
	var r struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	_ = json.Unmarshal(d, &r)
	return initName(json.RawMessage(`{"serverInfo":` + string(cmpRaw(r.Meta[transport.MetaServerInfo], json.RawMessage(`{}`))) + `}`))
}

// initName is the serverInfo name of an InitializeResult.
func initName(init json.RawMessage) string {
	var r struct {
		ServerInfo struct {
			Name string `json:"name"`
		} `json:"serverInfo"`
	}
	_ = json.Unmarshal(init, &r)
	return r.ServerInfo.Name
}

// decideSession relays a 2025-11-25 host's initialize and its answer; an upstream that
// refuses it but speaks a stateless revision gets a bridge that answers the host instead.
func (s *session) decideSession(ctx context.Context, req *jsonrpc.Request, early *[]jsonrpc.Message) (bool, error) {
	s.noteHost(req, transport.RequestMeta{})
	if err := s.up.Write(ctx, req); err != nil {
		return true, err
	}
	resp, extra, err := readAnswer(ctx, s.up, req.ID, s.p.cfg.Timeout)
	*early = append(*early, extra...)
	if gone(err) {
		return true, fmt.Errorf("%w (%v)", ErrUpstreamGone, err)
	}
	if err != nil {
		return true, err
	}
	if resp.Error != nil {
		if d, extra, perr := probeDiscover(ctx, s.up); perr == nil && supportsStateless(d) {
			*early = append(*early, extra...)
			s.p.log.Info("toolfence proxy: the upstream speaks only stateless revisions; bridging the host's session",
				"server", s.p.cfg.ServerID)
			b := newStatelessUp(s.up)
			s.setBridge(b)
			s.relaying(req.ID, nil)
			return true, b.Write(ctx, req)
		}
	}
	s.noteUpstream(resp)
	*early = append(*early, resp)
	return true, nil
}

// setBridge makes b the session's upstream connection (before anything else uses it).
func (s *session) setBridge(b mcp.Connection) {
	s.up = b
	s.mu.Lock()
	s.bridged = b
	s.mu.Unlock()
}

// dialStateless opens the upstream connection of one stateless host request: a share of
// one upstream connection (h.mux: a stdio child, or a bridged session of an HTTP upstream
// that speaks no stateless revision), or a connection of its own to an HTTP upstream that
// does (asked once, with server/discover).
func (h *HTTPServer) dialStateless(ctx context.Context) (mcp.Connection, io.Closer, error) {
	h.mu.Lock()
	mux, direct := h.mux, h.statelessDirect
	h.mu.Unlock()
	switch {
	case mux != nil:
		return mux.Open(ctx)
	case direct:
		return h.opts.Dial(ctx)
	}
	// An HTTP upstream not asked yet: its answer decides for the proxy's life.
	conn, closer, err := h.opts.Dial(ctx)
	if err != nil {
		return nil, nil, err
	}
	d, _, perr := probeDiscover(ctx, conn)
	_ = closer.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mux == nil && !h.statelessDirect {
		if perr == nil && !supportsStateless(d) {
			h.log.Info("toolfence proxy: the HTTP upstream speaks no stateless revision; stateless hosts share one bridged session")
			h.mux = h.newMux(false)
		} else {
			h.statelessDirect = true
		}
	}
	if h.mux != nil {
		return h.mux.Open(ctx)
	}
	return h.opts.Dial(ctx)
}

// newMux is the shared upstream of stateless requests: each connection it dials is asked
// server/discover (probe, for a stdio child: it speaks first to the proxy) and bridged
// (legacyUp) when it speaks no stateless revision (always, when probe is false).
func (h *HTTPServer) newMux(probe bool) *transport.Mux {
	p := h.p
	return &transport.Mux{
		Dial: func(ctx context.Context) (mcp.Connection, io.Closer, error) {
			conn, closer, err := h.opts.Dial(ctx)
			if err != nil || !probe {
				if err == nil {
					return newLegacyUp(conn), closer, nil
				}
				return nil, nil, err
			}
			d, _, err := probeDiscover(ctx, conn)
			if err != nil || supportsStateless(d) {
				return conn, closer, nil
			}
			h.log.Info("toolfence proxy: the upstream speaks no stateless revision; stateless hosts share one bridged session")
			return newLegacyUp(conn), closer, nil
		},
		OnNotice: func(n *jsonrpc.Request) {
			if n.Method == "notifications/tools/list_changed" {
				p.stateless.resetAll()
			}
		},
	}
}

// gone reports whether err, of a read or write of the upstream connection, means the
// upstream ended.
func gone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe) || errors.Is(err, os.ErrClosed) || errors.Is(err, syscall.EPIPE)
}
