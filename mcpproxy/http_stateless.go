package mcpproxy

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// Stateless hosts (MCP 2026-07-28) send each request on its own, without initialize or
// Mcp-Session-Id, with their revision and capabilities in the request's _meta (SEP-2575) and
// Mcp-Method / Mcp-Name headers that mirror the body (SEP-2243). The proxy serves each such
// POST as a session of its own (Serve over a connection that carries just that request,
// with an upstream connection of its own or a share of one child, HTTPOptions.Stateless):
// nothing of one host's request can reach another's. What outlives a request is the
// proxy's, never a session's: the tool lists of stateless hosts (per capability set, for
// statelessListTTL), the open rounds of multi-round calls (by key), what it protects.
//
// Protocol errors are answered with the status SEP-2575 gives them (transport.ErrorStatus):
// 400 for a missing or invalid _meta, a header that does not match the body and an
// unsupported revision; 404 for an unknown method (also upstream's, when the error is the
// whole answer).

// supportedStateless are the stateless revisions the proxy serves hosts.
var supportedStateless = []string{transport.Rev20260728}

// statelessRequest reports whether a POST without a session id is stateless: its
// Mcp-Protocol-Version header, or the _meta of a request in it, names a stateless revision,
// or it asks server/discover.
func statelessRequest(r *http.Request, msgs []jsonrpc.Message) bool {
	if transport.Stateless(r.Header.Get(transport.HeaderProtocolVersion)) {
		return true
	}
	for _, m := range msgs {
		if req, ok := m.(*jsonrpc.Request); ok && (req.Method == "server/discover" || transport.Stateless(transport.ReadMeta(req.Params).Version)) {
			return true
		}
	}
	return false
}

// checkStateless checks a stateless request's revision and headers before anything is
// relayed: Mcp-Protocol-Version must be sent and equal _meta's protocolVersion (-32020), which
// must be there (-32602) and a revision the proxy serves (-32022, with the supported ones);
// _meta's clientCapabilities must be there (-32602); Mcp-Method and Mcp-Name must match the
// body (-32020). It returns nil for a request that may go on.
func checkStateless(r *http.Request, req *jsonrpc.Request) *jsonrpc.Error {
	header := r.Header.Get(transport.HeaderProtocolVersion)
	meta := transport.ReadMeta(req.Params)
	switch {
	case header == "":
		return &jsonrpc.Error{Code: transport.CodeHeaderMismatch, Message: fmt.Sprintf(
			"toolfence proxy: the %s header is required on requests carrying %q", transport.HeaderProtocolVersion, transport.MetaProtocolVersion)}
	case !meta.HasMeta:
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "toolfence proxy: missing _meta: a stateless request carries its protocol version and client capabilities in params._meta"}
	case meta.Version == "":
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("toolfence proxy: missing or invalid _meta field %q", transport.MetaProtocolVersion)}
	case header != meta.Version:
		return &jsonrpc.Error{Code: transport.CodeHeaderMismatch, Message: fmt.Sprintf(
			"toolfence proxy: the %s header %q does not match _meta %s %q", transport.HeaderProtocolVersion, header, transport.MetaProtocolVersion, meta.Version)}
	case !served(meta.Version):
		data, _ := json.Marshal(map[string]any{"supported": append(append([]string(nil), supportedStateless...), transport.Rev20251125), "requested": meta.Version})
		return &jsonrpc.Error{Code: transport.CodeUnsupportedProtocol, Data: data,
			Message: fmt.Sprintf("toolfence proxy: protocol version %q is not supported (stateless: %s; with a session: %s)", meta.Version, transport.Rev20260728, transport.Rev20251125)}
	case len(meta.Capabilities) == 0 || string(meta.Capabilities) == "null":
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("toolfence proxy: missing or invalid _meta field %q", transport.MetaClientCapabilities)}
	}
	if err := transport.CheckRequestHeaders(r.Header, req, nil); err != nil {
		return &jsonrpc.Error{Code: transport.CodeHeaderMismatch, Message: "toolfence proxy: " + err.Error()}
	}
	return nil
}

func served(rev string) bool {
	for _, v := range supportedStateless {
		if v == rev {
			return true
		}
	}
	return false
}

// writeRPCError answers a protocol error of request id with its SEP-2575 status (400 when
// none applies).
func writeRPCError(w http.ResponseWriter, id jsonrpc.ID, e *jsonrpc.Error) {
	resp := &jsonrpc.Response{ID: id, Error: e}
	status := transport.ErrorStatus(resp)
	if status == 0 {
		status = http.StatusBadRequest
	}
	data, err := jsonrpc.EncodeMessage(resp)
	if err != nil {
		http.Error(w, "toolfence proxy: "+e.Message, status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// serveStateless serves one stateless POST of namespace ns: checked (checkStateless), then
// relayed by a session of its own until its request is answered. A notification alone has
// no request to belong to in a stateless exchange: it is accepted (202) and dropped.
func (h *HTTPServer) serveStateless(w http.ResponseWriter, r *http.Request, ns, owner string, msgs []jsonrpc.Message, batch bool) {
	if batch {
		jsonError(w, http.StatusBadRequest, codeInvalidRequest, "toolfence proxy: JSON-RPC batches are not allowed in protocol version "+transport.Rev20260728+"; nothing was relayed")
		return
	}
	req, ok := msgs[0].(*jsonrpc.Request)
	if !ok || !req.IsCall() {
		if ok && req.Method == "notifications/cancelled" {
			h.cancelStateless(owner, req)
		}
		w.WriteHeader(http.StatusAccepted)
		return
	}
	if reservedID(req.ID) {
		writeRPCError(w, req.ID, &jsonrpc.Error{Code: codeInvalidRequest,
			Message: fmt.Sprintf("toolfence proxy: invalid request: ids starting with %q are reserved for the proxy's own upstream requests; nothing was relayed", ReservedIDPrefix)})
		return
	}
	if e := checkStateless(r, req); e != nil {
		writeRPCError(w, req.ID, e)
		return
	}
	req.Extra = r.Header.Clone() // its Mcp-Param-* headers are checked against the tool's schema
	p, err := h.space(ns)
	if err != nil {
		h.log.Error("toolfence proxy: namespace unavailable", "namespace", ns, "err", err)
		http.Error(w, "toolfence proxy: namespace unavailable", http.StatusServiceUnavailable)
		return
	}
	up, closer, err := h.dialStateless(h.ctx)
	if err != nil {
		h.log.Error("toolfence proxy: cannot reach the upstream", "err", err)
		writeRPCError(w, req.ID, &jsonrpc.Error{Code: transport.CodeUpstreamHTTP, Message: "toolfence proxy: cannot reach the upstream server: " + err.Error()})
		return
	}
	conn := newDownConn("", h.log)
	conn.stateless = true
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		_ = up.Close()
		_ = closer.Close()
		http.Error(w, "toolfence proxy: shutting down", http.StatusServiceUnavailable)
		return
	}
	h.wg.Add(1)
	h.mu.Unlock()
	k := owner + "\x00" + hostKey(req.ID)
	h.mu.Lock()
	if h.statelessCalls == nil {
		h.statelessCalls = map[string]*downConn{}
	}
	h.statelessCalls[k] = conn
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		if h.statelessCalls[k] == conn {
			delete(h.statelessCalls, k)
		}
		h.mu.Unlock()
	}()
	served := make(chan struct{})
	go func() {
		defer h.wg.Done()
		defer close(served)
		if err := p.serve(h.ctx, conn, up, true); err != nil && h.ctx.Err() == nil && !conn.isClosed() {
			h.log.Debug("toolfence proxy: stateless request ended", "method", req.Method, "err", err)
		}
		_ = closer.Close()
	}()
	conn.servePOST(w, r, msgs, false, func() {})
	conn.Close() // the request is answered (or its host gone): its session ends
	<-served
}

// cancelStateless hands a stateless host's notifications/cancelled to its request in
// flight, the one of the same token with the id it names (the relay then cancels it as in a
// session); a cancellation of nothing in flight is dropped.
func (h *HTTPServer) cancelStateless(owner string, note *jsonrpc.Request) {
	id, ok := transport.CancelledID(note.Params)
	if !ok {
		return
	}
	h.mu.Lock()
	conn := h.statelessCalls[owner+"\x00"+hostKey(id)]
	h.mu.Unlock()
	if conn == nil {
		return
	}
	select {
	case conn.incoming <- note:
	case <-conn.done:
	}
}
