package transport

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/net/http/httpguts"
)

// CodeUpstreamHTTP is the JSON-RPC error code of the answer the proxy makes up for a request
// sent to an HTTP upstream that never answered it: the exchange failed (connection refused
// or dropped, a non-2xx status, a body that is not JSON-RPC, the stream ended before the
// answer and could not be resumed). For a protected call it means an unknown outcome; do not list it in a policy's
// no_effect codes. It is in the implementation-defined server-error range that MCP leaves
// to implementations (−32000…−32019; MCP reserves −32020…−32099); proxies before this
// code was changed used −32099.
const CodeUpstreamHTTP = -32010

// notSentMark marks the CodeUpstreamHTTP answers this process made for requests that never
// left it (the connection could not be made); see NotSent.
var notSentMark = func() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}()

// NotSent reports whether e is this process's own answer for a request to an HTTP upstream
// that could not be sent at all (nothing reached the upstream); false for any other error,
// among them a CodeUpstreamHTTP answer made by another process.
func NotSent(e *jsonrpc.Error) bool {
	if e.Code != CodeUpstreamHTTP {
		return false
	}
	var d struct {
		Sent *bool  `json:"sent"`
		Mark string `json:"mark"`
	}
	return json.Unmarshal(e.Data, &d) == nil && d.Sent != nil && !*d.Sent && d.Mark == notSentMark
}

// MaxUpstreamMessage bounds one message (a JSON body or one server-sent event) read from an
// HTTP upstream; a larger one fails its exchange.
const MaxUpstreamMessage = 32 << 20

// ErrUpstreamSession is wrapped by the read error of an HTTP upstream connection whose
// session the upstream no longer knows (404 to a request carrying its Mcp-Session-Id).
var ErrUpstreamSession = errors.New("transport: the HTTP upstream ended the session")

// Header names the proxy sets itself on requests to an HTTP upstream; --header may not.
var reservedHeaders = map[string]bool{
	"Accept": true, "Content-Type": true, "Content-Length": true, "Host": true, "Connection": true,
	"Transfer-Encoding": true, "Mcp-Session-Id": true, "Mcp-Protocol-Version": true, "Last-Event-Id": true,
}

// idempotencyHeaders make Go's net/http treat a POST as idempotent and silently send it
// again over a new connection after some failures; --header may not set them.
var idempotencyHeaders = map[string]bool{"Idempotency-Key": true, "X-Idempotency-Key": true}

// ParseHeaders turns "NAME=VALUE" flags into headers for DialUpstream. It returns an error
// naming the flag (by position and name, never its value, which may be a secret) for a
// flag without '=', an invalid header name or value, or a header the proxy sets itself
// (Accept, Content-Type, Mcp-Session-Id, Mcp-Protocol-Version, ...) or Idempotency-Key or
// X-Idempotency-Key (with them Go's HTTP client may re-send a POST). A name given twice
// sends both values.
func ParseHeaders(flags []string) (http.Header, error) {
	h := http.Header{}
	for i, f := range flags {
		name, value, ok := strings.Cut(f, "=")
		name = strings.TrimSpace(name)
		switch {
		case !ok:
			return nil, fmt.Errorf("mcpproxy: header %d: want NAME=VALUE, found no '='", i+1)
		case !httpguts.ValidHeaderFieldName(name):
			return nil, fmt.Errorf("mcpproxy: header %d: %q is not a valid header name", i+1, name)
		case !httpguts.ValidHeaderFieldValue(value):
			return nil, fmt.Errorf("mcpproxy: header %d (%s): the value holds characters a header may not (newline, control characters)", i+1, name)
		case idempotencyHeaders[http.CanonicalHeaderKey(name)]:
			return nil, fmt.Errorf("mcpproxy: header %d: %s may not be sent: Go's HTTP client re-sends a POST that carries it when a connection fails, which could run a tool call twice", i+1, http.CanonicalHeaderKey(name))
		case reservedHeaders[http.CanonicalHeaderKey(name)]:
			return nil, fmt.Errorf("mcpproxy: header %d: %s is set by the proxy itself", i+1, http.CanonicalHeaderKey(name))
		}
		h.Add(name, strings.TrimSpace(value))
	}
	return h, nil
}

// CheckUpstreamURL returns the parsed URL for an absolute http or https URL with a host and
// no fragment, else nil and an error naming the problem. The error never quotes the URL's user
// information or query, which may hold secrets.
func CheckUpstreamURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("mcpproxy: upstream URL: not a valid URL")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("mcpproxy: upstream URL: scheme %q: want http or https", u.Scheme)
	case u.Host == "":
		return nil, errors.New("mcpproxy: upstream URL: no host")
	case u.Fragment != "":
		return nil, errors.New("mcpproxy: upstream URL: a fragment (#...) is not sent to a server; remove it")
	}
	return u, nil
}

// redactedURL is u without user information and query, for logs and errors.
func redactedURL(u *url.URL) string {
	c := *u
	c.User, c.RawQuery, c.ForceQuery = nil, "", false
	return c.String()
}

// HTTPUpstream is an upstream MCP server reached over streamable HTTP.
type HTTPUpstream struct {
	// URL is the server's MCP endpoint (checked with CheckUpstreamURL). Required.
	URL string
	// Header is sent on every request (API keys, say; never logged). Defaults to none.
	Header http.Header
	// Client sends the requests. Defaults to a client without a timeout (notification
	// streams are long-lived; each protected call has its own timeout).
	Client *http.Client
	// Logger gets warnings about the upstream's stream (never header values). Defaults to
	// discarding them.
	Logger *slog.Logger
}

// DialUpstream returns a connection to the streamable-HTTP MCP server at rawURL, sending
// header on every request. It checks the URL (CheckUpstreamURL) but does not contact the
// server: the host's initialize is the first request.
func DialUpstream(ctx context.Context, rawURL string, header http.Header) (mcp.Connection, error) {
	return HTTPUpstream{URL: rawURL, Header: header}.Connect(ctx)
}

// Connect returns a new connection (one upstream session) to the server; see DialUpstream.
// It returns an error only for a URL that CheckUpstreamURL refuses.
//
// Why not go-sdk's StreamableClientTransport: used as a raw relay (no mcp.Client above it),
// it never learns that the session is initialized, so it sends no Mcp-Protocol-Version and
// never opens the notification stream (GET); its Write blocks until an upstream that answers
// in JSON has answered the whole call, out of reach of the call's timeout; and a 5xx to one
// call fails the whole connection. This connection posts each request in its own goroutine,
// turns a failed exchange into a JSON-RPC error answer for that request only
// (CodeUpstreamHTTP: an unknown outcome for a protected call), and opens the GET stream once
// the host has sent notifications/initialized. A stream (a request's or the GET stream)
// that ends early is resumed with Last-Event-ID when the upstream gave its events ids,
// after the retry time it set (see DefaultRetry, MaxRetry, MaxResumes); never in the
// stateless revision (2026-07-28), which has no resumption.
//
// Not supported: JSON-RPC batches in requests the proxy sends.
func (h HTTPUpstream) Connect(ctx context.Context) (mcp.Connection, error) {
	u, err := CheckUpstreamURL(h.URL)
	if err != nil {
		return nil, err
	}
	client := h.Client
	if client == nil {
		client = &http.Client{}
	}
	log := h.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	return &httpConn{
		url: u.String(), name: redactedURL(u), header: h.Header.Clone(), client: client, log: log, backoff: DefaultRetry,
		ctx: cctx, cancel: cancel, incoming: make(chan jsonrpc.Message, 64),
		done: make(chan struct{}), failed: make(chan struct{}),
	}, nil
}

// httpConn is one session with an HTTP upstream.
type httpConn struct {
	url, name string // name: the URL without secrets
	header    http.Header
	client    *http.Client
	log       *slog.Logger
	backoff   time.Duration   // the least wait before resuming a stream after a failed attempt
	ctx       context.Context // the connection's life; cancelled by Close
	cancel    context.CancelFunc
	incoming  chan jsonrpc.Message
	wg        sync.WaitGroup

	closeOnce sync.Once
	done      chan struct{}
	failOnce  sync.Once
	failed    chan struct{}
	failErr   error

	mu        sync.Mutex
	sessionID string
	protocol  string
	initID    string // idKey of the initialize request, until answered
	// cancels are the requests in flight, by idKey: each closed when notifications/cancelled
	// names its request (a stream of it that ended is not resumed then).
	cancels map[string]chan struct{}
	// listenReady is made when the GET stream starts and closed once its first request
	// was answered.
	listenReady chan struct{}
	readyOnce   sync.Once
}

var _ mcp.Connection = (*httpConn)(nil)

// SessionID returns the upstream's Mcp-Session-Id, "" before initialize was answered.
func (c *httpConn) SessionID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessionID
}

// TaskScope names the scope of the task ids the upstream issues on this connection: "" in
// a session (they belong to it), else the server itself ("http-" and 16 hex digits of the
// digest of its URL): a stateless server's task ids hold for every request.
func (c *httpConn) TaskScope() string {
	if c.SessionID() != "" {
		return ""
	}
	d := sha256.Sum256([]byte(c.url))
	return "http-" + hex.EncodeToString(d[:8])
}

// Read returns the next message of the upstream: an answer, a notification or a request.
// It returns io.EOF after Close and an error wrapping ErrUpstreamSession when the upstream
// forgot the session.
func (c *httpConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case <-c.failed:
		return nil, c.failErr
	default:
	}
	select {
	case msg := <-c.incoming:
		return msg, nil
	case <-c.failed:
		return nil, c.failErr
	case <-c.done:
		return nil, io.EOF
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Write sends msg upstream. A request is posted in the background and always returns nil:
// its answer, or a made-up CodeUpstreamHTTP error when the exchange fails, comes from Read.
// A notification or an answer to the upstream's request is posted before Write returns; a
// failure is logged, not returned, unless the connection is closed or the upstream forgot
// the session.
func (c *httpConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	select {
	case <-c.done:
		return errors.New("mcpproxy: the HTTP upstream connection is closed")
	case <-c.failed:
		return c.failErr
	default:
	}
	data, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	extra := c.requestHeaders(ctx, msg)
	if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
		if req.Method == "initialize" {
			c.mu.Lock()
			c.initID = idKey(req.ID)
			c.mu.Unlock()
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.call(req, data, extra)
		}()
		return nil
	}
	if r, ok := msg.(*jsonrpc.Request); ok && r.Method == "notifications/cancelled" {
		c.noteCancel(r.Params)
	}
	wctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	resp, err := c.post(wctx, data, extra)
	if err != nil {
		c.log.Warn("toolfence proxy: sending to the HTTP upstream failed", "upstream", c.name, "err", err)
		return nil
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		c.log.Warn("toolfence proxy: the HTTP upstream refused a message", "upstream", c.name, "status", resp.StatusCode)
	}
	if r, ok := msg.(*jsonrpc.Request); ok && r.Method == "notifications/initialized" {
		// Wait (a little) until the upstream holds the notification stream: what it sends
		// outside any call before then (a list_changed, say) is lost.
		select {
		case <-c.startListening():
		case <-time.After(5 * time.Second):
		case <-c.ctx.Done():
		}
	}
	return nil
}

// requestHeaders are the standard headers of a request (or notification) in a stateless
// revision (its _meta's, SEP-2243: Mcp-Protocol-Version, Mcp-Method, Mcp-Name and the
// Mcp-Param-* of the bindings ctx carries, WithParamBindings); nil for anything else.
func (c *httpConn) requestHeaders(ctx context.Context, msg jsonrpc.Message) http.Header {
	req, ok := msg.(*jsonrpc.Request)
	if !ok {
		return nil
	}
	rev := ReadMeta(req.Params).Version
	if !Stateless(rev) {
		return nil
	}
	return RequestHeaders(rev, req, paramBindings(ctx))
}

// post sends one JSON-RPC body with the session's headers, and extra's over them. A 404 to
// a request carrying the session id fails the connection (ErrUpstreamSession).
func (c *httpConn) post(ctx context.Context, data []byte, extra http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	c.setHeaders(req)
	for k, vs := range extra {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, c.scrub(err)
	}
	if id := resp.Header.Get("Mcp-Session-Id"); id != "" {
		c.mu.Lock()
		if c.sessionID == "" {
			c.sessionID = id
		}
		c.mu.Unlock()
	}
	if resp.StatusCode == http.StatusNotFound && req.Header.Get("Mcp-Session-Id") != "" {
		c.fail(fmt.Errorf("%w (HTTP 404 from %s)", ErrUpstreamSession, c.name))
	}
	return resp, nil
}

// scrub replaces the URL in a client error by its redacted form.
func (c *httpConn) scrub(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s %s: %w", ue.Op, c.name, ue.Err)
	}
	return err
}

func (c *httpConn) setHeaders(req *http.Request) {
	for k, vs := range c.header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sessionID != "" {
		req.Header.Set("Mcp-Session-Id", c.sessionID)
	}
	if c.protocol != "" {
		req.Header.Set("Mcp-Protocol-Version", c.protocol)
	}
}

// call posts one request and delivers what comes back until its answer; when no answer
// comes, it delivers a CodeUpstreamHTTP error answer instead.
func (c *httpConn) call(req *jsonrpc.Request, body []byte, extra http.Header) {
	cancelled := c.watchCancel(req.ID)
	answered, err := c.exchange(req, body, extra, cancelled)
	c.unwatchCancel(req.ID)
	if answered {
		return
	}
	if err == nil {
		err = errors.New("the upstream ended its answer without answering the request")
	}
	// data.sent is false when the connection could not even be made: the request never
	// left, so a protected call is recorded failed (never ran) and may be retried. Such an
	// answer carries this process's notSentMark, which an upstream cannot know: an upstream
	// that answers CodeUpstreamHTTP {"sent": false} itself is not believed (unknown).
	var op *net.OpError
	sent := !(errors.As(err, &op) && op.Op == "dial")
	fields := map[string]any{"sent": sent}
	if !sent {
		fields["mark"] = notSentMark
	}
	data, _ := json.Marshal(fields)
	c.deliver(&jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: CodeUpstreamHTTP, Data: data,
		Message: fmt.Sprintf("toolfence proxy: no answer from the HTTP upstream %s to %s: %v", c.name, req.Method, err)}})
}

// exchange posts req and delivers the messages of its answer, reporting whether the answer
// to req was among them. A stream that ends before the answer is resumed (resume) unless
// the upstream broke the protocol on it; cancelled closes when req is cancelled.
func (c *httpConn) exchange(req *jsonrpc.Request, data []byte, extra http.Header, cancelled <-chan struct{}) (answered bool, err error) {
	resp, err := c.post(c.ctx, data, extra)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	want := idKey(req.ID)
	if resp.StatusCode != http.StatusOK {
		// A stateless server answers a protocol error with 400 or 404 and the JSON-RPC
		// error as the body (SEP-2575): that is its answer. Anything else is no answer.
		if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); (resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusNotFound) && ct == "application/json" {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			if m, err := jsonrpc.DecodeMessage(body); err == nil {
				if r, ok := m.(*jsonrpc.Response); ok && r.Error != nil && idKey(r.ID) == want {
					c.deliver(r)
					return true, nil
				}
			}
			return false, fmt.Errorf("HTTP status %d", resp.StatusCode)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return false, fmt.Errorf("HTTP status %d", resp.StatusCode)
	}
	take := func(body []byte) error {
		msgs, err := DecodeMessages(body)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			switch r := m.(type) {
			case *jsonrpc.Response:
				if idKey(r.ID) == want {
					answered = true
				}
			case *jsonrpc.Request:
				if r.IsCall() {
					r.Extra = related{req.ID} // a request of upstream's on this request's stream belongs to it
				}
			}
			c.deliver(m)
		}
		return nil
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch ct {
	case "application/json":
		body, err := io.ReadAll(io.LimitReader(resp.Body, MaxUpstreamMessage+1))
		switch {
		case err != nil:
			return false, err
		case len(body) > MaxUpstreamMessage:
			return false, fmt.Errorf("the answer exceeds %d bytes", MaxUpstreamMessage)
		}
		if err := take(body); err != nil {
			return false, err
		}
		return answered, nil
	case "text/event-stream":
		// read reads one stream (the POST's, then each resumed one) until the answer.
		read := func(body io.Reader, cur *sseCursor) (bool, error) {
			err := readEvents(body, cur, func(data []byte) error {
				if err := take(data); err != nil {
					return brokenStream{err}
				}
				if answered {
					return errStop
				}
				return nil
			})
			if answered {
				return true, nil
			}
			return false, err
		}
		cur := &sseCursor{}
		ok, err := read(resp.Body, cur)
		var broken brokenStream
		if ok || errors.As(err, &broken) || c.ctx.Err() != nil {
			return ok, err
		}
		resp.Body.Close()
		return c.resume(req, cur, err, cancelled, read)
	default:
		return false, fmt.Errorf("content type %q: want application/json or text/event-stream", ct)
	}
}

// related is the Extra of an upstream's request that came on the response stream of one of
// the requests sent to it.
type related struct{ id jsonrpc.ID }

// RelatedRequest returns the id of the request whose response stream carried the upstream
// request req (ok false when it came on no request's stream: the GET stream, stdio).
func RelatedRequest(req *jsonrpc.Request) (jsonrpc.ID, bool) {
	r, ok := req.Extra.(related)
	return r.id, ok
}

// DecodeMessages decodes a JSON-RPC message or a batch of them (a JSON array) as
// jsonrpc.DecodeMessage does each. It returns an error saying the body is not JSON-RPC
// when it is not JSON, or one of its messages is not a valid message.
func DecodeMessages(body []byte) ([]jsonrpc.Message, error) {
	body = bytes.TrimSpace(body)
	var raws []json.RawMessage
	if len(body) > 0 && body[0] == '[' {
		if err := json.Unmarshal(body, &raws); err != nil {
			return nil, fmt.Errorf("the answer is not JSON-RPC: %w", err)
		}
	} else {
		raws = []json.RawMessage{body}
	}
	msgs := make([]jsonrpc.Message, 0, len(raws))
	for _, r := range raws {
		m, err := jsonrpc.DecodeMessage(r)
		if err != nil {
			return nil, fmt.Errorf("the answer is not JSON-RPC: %w", err)
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// deliver hands msg to Read, noting the protocol version of the initialize answer.
func (c *httpConn) deliver(msg jsonrpc.Message) {
	if r, ok := msg.(*jsonrpc.Response); ok {
		c.mu.Lock()
		if c.initID != "" && idKey(r.ID) == c.initID {
			c.initID = ""
			var res struct {
				ProtocolVersion string `json:"protocolVersion"`
			}
			if r.Error == nil && json.Unmarshal(r.Result, &res) == nil {
				c.protocol = res.ProtocolVersion
			}
		}
		c.mu.Unlock()
	}
	select {
	case c.incoming <- msg:
	case <-c.done:
	}
}

// startListening opens the notification stream (GET) once, in the background. The channel
// it returns is closed once the first GET has been answered (or has failed).
func (c *httpConn) startListening() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.listenReady == nil {
		c.listenReady = make(chan struct{})
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.listen()
		}()
	}
	return c.listenReady
}

// listenAnswered closes listenReady once.
func (c *httpConn) listenAnswered() { c.readyOnce.Do(func() { close(c.listenReady) }) }

// listen reads the upstream's notification stream, opening it again when it drops: after
// the stream's retry time (DefaultRetry without one; after a failure at least
// DefaultRetry, doubling), resuming it with Last-Event-ID once the upstream gave its
// events ids (never in a stateless revision), until MaxResumes attempts in a row fail.
// An upstream without one (405, any 4xx) is left alone; one that cannot resume it from
// the last event id (a 4xx) is asked for a new stream.
func (c *httpConn) listen() {
	cur := &sseCursor{}
	failures := 0
	for failures < MaxResumes {
		got, retry := c.listenOnce(cur)
		if !retry {
			return
		}
		if got {
			failures = 0
		} else {
			failures++
		}
		t := time.NewTimer(cur.wait(failures, c.backoff))
		select {
		case <-c.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	c.log.Warn("toolfence proxy: the HTTP upstream's notification stream keeps failing; notifications outside calls are lost", "upstream", c.name)
}

// listenOnce reads one GET stream, resuming cur's; got: it delivered a message or a new
// event id; retry: try again.
func (c *httpConn) listenOnce(cur *sseCursor) (got, retry bool) {
	last := ""
	c.mu.Lock()
	if !Stateless(c.protocol) {
		last = cur.lastID
	}
	c.mu.Unlock()
	resp, err := c.get(last)
	c.listenAnswered()
	if err != nil {
		return false, c.ctx.Err() == nil
	}
	defer resp.Body.Close()
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		if last != "" && resp.StatusCode/100 == 4 && resp.StatusCode != http.StatusNotFound {
			c.log.Warn("toolfence proxy: the HTTP upstream cannot resume its notification stream (Last-Event-ID); opening a new one, notifications since its last event may be lost",
				"upstream", c.name, "status", resp.StatusCode)
			cur.lastID = ""
			return false, true
		}
		return false, resp.StatusCode >= 500
	}
	_ = readEvents(resp.Body, cur, func(data []byte) error {
		msgs, err := DecodeMessages(data)
		if err != nil {
			c.log.Warn("toolfence proxy: the HTTP upstream sent a message that is not JSON-RPC on its notification stream", "upstream", c.name)
			return nil
		}
		for _, m := range msgs {
			got = true
			c.deliver(m)
		}
		return nil
	})
	return got || cur.lastID != last, c.ctx.Err() == nil
}

func (c *httpConn) fail(err error) {
	c.failOnce.Do(func() {
		c.failErr = err
		close(c.failed)
	})
}

// Close ends the session: it stops every exchange in flight, sends DELETE with the
// session id (best effort, 5 s) and returns once its goroutines have ended.
func (c *httpConn) Close() error {
	c.closeOnce.Do(func() {
		close(c.done)
		c.cancel()
		c.wg.Wait()
		if id := c.SessionID(); id != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if req, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.url, nil); err == nil {
				c.setHeaders(req)
				if resp, err := c.client.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		}
	})
	return nil
}

// idKey identifies a request id (numbers and strings apart).
func idKey(id jsonrpc.ID) string { return fmt.Sprintf("%T:%v", id.Raw(), id.Raw()) }
