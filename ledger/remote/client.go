package remote

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// Options configure a Client.
type Options struct {
	// Token is sent as "Authorization: Bearer TOKEN" when set.
	Token string
	// Timeout bounds each request but watch's stream (which lasts until its context
	// ends). A mutating request that times out after it was sent returns an error wrapping
	// ledger.ErrOutcomeUnknown. Defaults to 30 seconds.
	Timeout time.Duration
	// MaxResponse caps an answer's body in bytes. Defaults to 256 MiB.
	MaxResponse int64
	// Transport carries the requests. Defaults to a transport of its own (for a unix
	// endpoint, one that dials the socket).
	Transport http.RoundTripper
}

// DefaultTimeout and DefaultMaxResponse are the defaults of Options.
const (
	DefaultTimeout     = 30 * time.Second
	DefaultMaxResponse = 256 << 20
)

// Client is a ledger.Ledger served by a Handler elsewhere. It is safe for concurrent use.
// It also implements ledger.Watcher and ledger.OpenCounter (the server answers with an
// error when its ledger does not).
type Client struct {
	base   string // URL of the prefix, ending in "/"
	where  string // the endpoint, for messages (no credentials)
	opts   Options
	hc     *http.Client
	own    *http.Transport // closed by Close when the client made it
	closed atomic.Bool
	// watches are the streams in flight, ended by Close.
	mu      sync.Mutex
	watches map[*watchStream]struct{}
	// prove is the client's proof of holding (proof.go).
	prove *prover
}

var (
	_ ledger.Ledger      = (*Client)(nil)
	_ ledger.Watcher     = (*Client)(nil)
	_ ledger.OpenCounter = (*Client)(nil)
)

// New returns a Client of the ledger served at endpoint: "http://HOST:PORT" or
// "https://HOST:PORT" (Path is appended when the URL has no path), or "unix:/PATH" (a unix
// socket; Path is used on it). It does not connect: the first call does. An endpoint that
// is none of these gets an error wrapping ErrInvalidEndpoint.
func New(endpoint string, opts Options) (*Client, error) {
	opts.Timeout = cmp.Or(opts.Timeout, DefaultTimeout)
	opts.MaxResponse = cmp.Or(opts.MaxResponse, DefaultMaxResponse)
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrInvalidEndpoint, redact(endpoint), err)
	}
	c := &Client{opts: opts, watches: map[*watchStream]struct{}{}, prove: newProver()}
	var dial func(ctx context.Context, network, addr string) (net.Conn, error)
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return nil, fmt.Errorf("%w: %q has no host", ErrInvalidEndpoint, redact(endpoint))
		}
		if u.User != nil {
			return nil, fmt.Errorf("%w: %q: give the token in Options.Token, not in the URL", ErrInvalidEndpoint, redact(endpoint))
		}
		p := u.Path
		if p == "" || p == "/" {
			p = Path
		}
		u.Path, u.RawQuery, u.Fragment = strings.TrimSuffix(p, "/")+"/", "", ""
		c.base, c.where = u.String(), u.Scheme+"://"+u.Host
	case "unix":
		sock := cmp.Or(u.Path, u.Opaque)
		if sock == "" {
			return nil, fmt.Errorf("%w: %q names no socket path (want unix:/PATH)", ErrInvalidEndpoint, endpoint)
		}
		var d net.Dialer
		dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
			addr, release, err := sockAddr(sock)
			if err != nil {
				return nil, err
			}
			defer release()
			return d.DialContext(ctx, "unix", addr)
		}
		c.base, c.where = "http://toolfence"+Path, "unix:"+sock
	default:
		return nil, fmt.Errorf("%w: %q: want http://HOST:PORT, https://HOST:PORT or unix:/PATH", ErrInvalidEndpoint, redact(endpoint))
	}
	rt := opts.Transport
	if rt == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		if dial != nil {
			t.DialContext, t.Proxy = dial, nil
		}
		t.MaxIdleConnsPerHost = 128
		c.own, rt = t, t
	}
	c.hc = &http.Client{Transport: rt, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return c, nil
}

// redact drops a URL's userinfo for messages.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		return u.Redacted()
	}
	return s
}

// Endpoint returns where the client sends its requests (never a credential).
func (c *Client) Endpoint() string { return c.where }

// Describe implements ledger.Describer: system "toolfence", the endpoint as namespace, a
// remote backend.
func (c *Client) Describe() ledger.Description {
	return ledger.Description{System: "toolfence", Namespace: c.where, Remote: true}
}

// Reserve implements ledger.Ledger over the wire. Reserve, Commit and Renew send the
// client's proof of holding (see proof.go); every record returned names this client's
// holders as its caller passed them.
func (c *Client) Reserve(ctx context.Context, p ledger.ReserveParams) (*ledger.ReserveResult, error) {
	in := reserveRequest{ReserveParams: p, Proof: c.prove.secret}
	var out *ledger.ReserveResult
	err := c.call(ctx, "reserve", true, in, &out)
	if out != nil {
		c.prove.own(out.Residual)
		c.prove.ownLease(&out.Lease)
	}
	return out, err
}

// Commit implements ledger.Ledger.
func (c *Client) Commit(ctx context.Context, p ledger.CommitParams) (*residual.Residual, error) {
	in := commitRequest{CommitParams: p, Proof: c.prove.secret}
	return c.record(ctx, "commit", true, in)
}

// Renew implements ledger.Ledger.
func (c *Client) Renew(ctx context.Context, p ledger.RenewParams) (lease.Lease, error) {
	in := renewRequest{RenewParams: p, Proof: c.prove.secret}
	var out lease.Lease
	err := c.call(ctx, "renew", true, in, &out)
	c.prove.ownLease(&out)
	return out, err
}

// Resolve implements ledger.Ledger.
func (c *Client) Resolve(ctx context.Context, p ledger.ResolveParams) (*residual.Residual, error) {
	return c.record(ctx, "resolve", true, p)
}

// AppendEvidence implements ledger.Ledger.
func (c *Client) AppendEvidence(ctx context.Context, p ledger.EvidenceParams) (*residual.Residual, error) {
	return c.record(ctx, "evidence", true, p)
}

// Get implements ledger.Ledger.
func (c *Client) Get(ctx context.Context, p ledger.GetParams) (*residual.Residual, error) {
	return c.record(ctx, "get", false, p)
}

// List implements ledger.Ledger.
func (c *Client) List(ctx context.Context, p ledger.ListParams) (*ledger.Page, error) {
	var out *ledger.Page
	err := c.call(ctx, "list", false, p, &out)
	if out != nil {
		for _, r := range out.Residuals {
			c.prove.own(r)
		}
	}
	return out, err
}

// record runs a step that answers one residual, with this client's holders as it named them.
func (c *Client) record(ctx context.Context, method string, mutating bool, in any) (*residual.Residual, error) {
	var out *residual.Residual
	err := c.call(ctx, method, mutating, in, &out)
	c.prove.own(out)
	return out, err
}

func (c *Client) GC(ctx context.Context, p ledger.GCParams) (ledger.GCResult, error) {
	var out ledger.GCResult
	err := c.call(ctx, "gc", true, p, &out)
	return out, err
}

// OpenResiduals implements ledger.OpenCounter over the wire; it needs access to every
// namespace (ledger.ErrForbidden otherwise).
func (c *Client) OpenResiduals(ctx context.Context) ([]ledger.OpenCount, error) {
	var out []ledger.OpenCount
	err := c.call(ctx, "open", false, openParams{}, &out)
	return out, err
}

// Close ends the client's watch streams and idle connections. Calls after Close return
// errors wrapping lease.ErrClosed; it closes nothing on the server.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.mu.Lock()
	for w := range c.watches {
		w.cancel()
	}
	c.mu.Unlock()
	if c.own != nil {
		c.own.CloseIdleConnections()
	}
	return nil
}

// call sends one step and decodes its answer into out.
func (c *Client) call(ctx context.Context, method string, mutating bool, in, out any) error {
	if c.closed.Load() {
		return fmt.Errorf("%w: remote ledger %s: %s", lease.ErrClosed, c.where, method)
	}
	resp, sent, err := c.post(ctx, method, in, c.opts.Timeout)
	if err != nil {
		return c.transportErr(ctx, method, mutating, sent, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, c.opts.MaxResponse+1))
	if err != nil {
		return c.transportErr(ctx, method, mutating, true, fmt.Errorf("reading the answer: %w", err))
	}
	if int64(len(body)) > c.opts.MaxResponse {
		return c.lost(method, mutating, fmt.Errorf("the answer exceeds %d bytes", c.opts.MaxResponse))
	}
	var env struct {
		Result json.RawMessage `json:"result"`
		Error  *wireError      `json:"error"`
	}
	if jerr := json.Unmarshal(body, &env); jerr != nil {
		if resp.StatusCode == http.StatusOK || resp.StatusCode >= 500 {
			// Not our server's answer (a proxy in between?): whatever happened is unknown.
			return c.lost(method, mutating, fmt.Errorf("HTTP %d with an answer that is not this protocol: %.200q", resp.StatusCode, body))
		}
		return fmt.Errorf("%w: remote ledger %s: %s: HTTP %d: %.200q", ErrProtocol, c.where, method, resp.StatusCode, body)
	}
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode >= 500 && (env.Error == nil || !ownCode(env.Error.Codes)) {
			// JSON, but not this server's refusal (its only 5xx is 503 "unavailable", sent
			// before the step runs): a proxy in between, a crash mid-step. Unknown.
			return c.lost(method, mutating, fmt.Errorf("HTTP %d without an error of this protocol: %.200q", resp.StatusCode, body))
		}
		if env.Error == nil {
			env.Error = &wireError{Message: http.StatusText(resp.StatusCode), Codes: []string{"protocol"}}
		}
		return fromWire(method, resp.StatusCode, env.Error)
	}
	hasResult := len(env.Result) > 0 && string(env.Result) != "null"
	if hasResult {
		if jerr := json.Unmarshal(env.Result, out); jerr != nil {
			return c.lost(method, mutating, fmt.Errorf("decoding the result: %w", jerr))
		}
	}
	if env.Error != nil {
		return fromWire(method, resp.StatusCode, env.Error)
	}
	if !hasResult && method != "open" { // open's empty count is null; every other step answers a value
		if mutating {
			return c.lost(method, mutating, fmt.Errorf("HTTP 200 with neither a result nor an error: %.200q", body))
		}
		return fmt.Errorf("%w: remote ledger %s: %s: HTTP 200 with neither a result nor an error: %.200q", ErrProtocol, c.where, method, body)
	}
	return nil
}

// ownCode reports whether names holds the code of a sentinel of this protocol.
func ownCode(names []string) bool {
	for _, name := range names {
		for _, c := range codes {
			if c.code == name {
				return true
			}
		}
	}
	return false
}

// post sends one request. sent reports whether its headers were written, after which the
// server may act on it.
func (c *Client) post(ctx context.Context, method string, in any, timeout time.Duration) (*http.Response, bool, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %s: encoding the parameters: %w", ledger.ErrInvalidParams, method, err)
	}
	// What the last attempt of the transport wrote (it retries a request on a fresh
	// connection when a reused one failed before anything reached it): headers buffered,
	// the whole request handed to the kernel, or a write that failed. Only a request
	// written whole can have been decoded and run by the server (Handler reads the whole
	// body before it runs anything); headers without an outcome of the write are counted
	// as sent, to be safe.
	var wrote atomic.Int32
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaders: func() { wrote.Store(wroteHeaders) },
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err != nil {
				wrote.Store(writeFailed)
			} else {
				wrote.Store(wroteAll)
			}
		},
	})
	var cancel context.CancelFunc = func() {}
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+method, bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.Token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		cancel()
		w := wrote.Load()
		return nil, w == wroteHeaders || w == wroteAll, err
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, true, nil
}

// States of a request's write, as its trace reports them.
const (
	wroteNothing int32 = iota
	wroteHeaders
	wroteAll
	writeFailed
)

// cancelBody ends a request's context when its body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// transportErr classifies a request that got no answer.
func (c *Client) transportErr(ctx context.Context, method string, mutating, sent bool, err error) error {
	if sent {
		return c.lost(method, mutating, err)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("remote ledger %s: %s not sent: %w", c.where, method, context.Cause(ctx))
	}
	return fmt.Errorf("remote: %s: %s not sent: %w: %w", c.where, method, ledger.ErrUnavailable, err)
}

// lost is the error of a request that was sent but whose answer is missing or unreadable.
func (c *Client) lost(method string, mutating bool, err error) error {
	if mutating {
		return fmt.Errorf("%w: %w: remote ledger %s: %s was sent but its answer was lost, so it may or may not have happened: %w",
			ledger.ErrOutcomeUnknown, ErrConnectionLost, c.where, method, err)
	}
	return fmt.Errorf("%w: remote ledger %s: %s: %w", ErrConnectionLost, c.where, method, err)
}

// watchStream is one watch in flight.
type watchStream struct{ cancel context.CancelFunc }

// Watch implements ledger.Watcher over the wire: it returns once the server has accepted
// the stream, and delivers its changes until ctx ends. The channel also closes when the
// connection to the server breaks or Close is called: watch again (and re-list) then, as
// after any gap.
func (c *Client) Watch(ctx context.Context, namespace string) (<-chan ledger.Change, error) {
	if c.closed.Load() {
		return nil, fmt.Errorf("%w: remote ledger %s: watch", lease.ErrClosed, c.where)
	}
	sctx, cancel := context.WithCancel(ctx)
	ws := &watchStream{cancel: cancel}
	c.mu.Lock()
	c.watches[ws] = struct{}{}
	c.mu.Unlock()
	done := func() {
		cancel()
		c.mu.Lock()
		delete(c.watches, ws)
		c.mu.Unlock()
	}
	// The answer's headers must come within the timeout; the stream then lasts.
	timer := time.AfterFunc(c.opts.Timeout, cancel)
	resp, sent, err := c.post(sctx, "watch", watchParams{Namespace: namespace}, 0)
	stopped := timer.Stop()
	if err == nil && !stopped {
		resp.Body.Close()
		err = context.DeadlineExceeded
	}
	if err != nil {
		done()
		return nil, c.transportErr(ctx, "watch", false, sent, err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/x-ndjson") {
		defer resp.Body.Close()
		defer done()
		var env struct {
			Error *wireError `json:"error"`
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(body, &env) != nil || env.Error == nil {
			return nil, fmt.Errorf("%w: remote ledger %s: watch: HTTP %d: %.200q", ErrProtocol, c.where, resp.StatusCode, body)
		}
		return nil, fromWire("watch", resp.StatusCode, env.Error)
	}
	ch := make(chan ledger.Change, 64)
	go func() {
		defer close(ch)
		defer done()
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 4096), 1<<20)
		for sc.Scan() {
			var ch1 ledger.Change
			if json.Unmarshal(sc.Bytes(), &ch1) != nil {
				return
			}
			select {
			case ch <- ch1:
			case <-sctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// IsUnavailable reports whether err says the server could not be reached, or lost the
// answer (ledger.ErrUnavailable, ErrConnectionLost): the server may be gone.
func IsUnavailable(err error) bool {
	return errors.Is(err, ledger.ErrUnavailable) || errors.Is(err, ErrConnectionLost)
}
