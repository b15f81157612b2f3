package transport

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Resuming an upstream's server-sent event stream (MCP 2025-11-25, "Resumability and
// Redelivery"; the stateless 2026-07-28 revision has none: SEP-2575). When a stream that
// carries a request's answer ends first, and the upstream gave its events ids, the proxy
// waits the stream's retry time and asks for the rest with a GET carrying Last-Event-ID.
const (
	// DefaultRetry is how long the proxy waits before resuming a stream whose server sent
	// no retry field (the SSE standard leaves it to the client; the Go SDK waits about 1 s).
	DefaultRetry = time.Second
	// MaxRetry bounds the wait the proxy honours: a stream whose server asks for a longer
	// one before reconnecting is not resumed (its request gets the CodeUpstreamHTTP answer).
	MaxRetry = time.Minute
	// MaxResumes bounds the attempts in a row to resume a request's stream that bring no
	// new event (a failed GET, a stream that ends at once); a stream that brings new
	// events is resumed again, until the request's answer comes, it is cancelled
	// (notifications/cancelled: a protected call's timeout sends one) or the connection
	// closes.
	MaxResumes = 5
)

// maxRetryMillis caps a retry field read (any longer wait is past MaxRetry anyway).
const maxRetryMillis = 24 * 3600 * 1000

// sseCursor is what a client keeps of one stream to resume it: the last event id the
// server gave (the SSE "last event ID string") and the reconnection time it set.
type sseCursor struct {
	lastID   string
	retry    time.Duration
	hasRetry bool
}

// wait is how long to wait before the next attempt to resume, after failures attempts in
// a row that brought nothing: the server's retry (DefaultRetry without one), doubled per
// failure from at least floor.
func (c *sseCursor) wait(failures int, floor time.Duration) time.Duration {
	d := DefaultRetry
	if c.hasRetry {
		d = c.retry
	}
	if failures > 0 {
		d = max(d, floor) << min(failures-1, 6)
	}
	return d
}

// readEvents calls fn with the data of each server-sent "message" event of r that has
// data, until r ends or fn returns an error (returned as it is); it keeps cur up to date
// with the id and retry fields (an id takes effect when its event is complete; a priming
// event, an id with empty data, counts). An event larger than MaxUpstreamMessage is a
// brokenStream error; a stream that ends returns io.ErrUnexpectedEOF, one that fails the
// read error.
func readEvents(r io.Reader, cur *sseCursor, fn func(data []byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxUpstreamMessage)
	var data bytes.Buffer
	event, id, hasID := "", "", false
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			if hasID {
				cur.lastID = id
			}
			if data.Len() > 0 && (event == "" || event == "message") {
				if err := fn(bytes.Clone(data.Bytes())); err != nil {
					return err
				}
			}
			data.Reset()
			event, hasID = "", false
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			if data.Len()+len(value) > MaxUpstreamMessage {
				return brokenStream{fmt.Errorf("an event exceeds %d bytes", MaxUpstreamMessage)}
			}
			data.Write(value)
		case "event":
			event = string(value)
		case "id":
			if !bytes.ContainsRune(value, 0) {
				id, hasID = string(value), true
			}
		case "retry":
			if ms, err := strconv.ParseUint(string(value), 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
				cur.retry, cur.hasRetry = time.Duration(min(ms, maxRetryMillis))*time.Millisecond, true
			}
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return brokenStream{fmt.Errorf("an event line exceeds %d bytes", MaxUpstreamMessage)}
		}
		return err
	}
	return io.ErrUnexpectedEOF
}

// brokenStream is an error of a stream that broke the protocol (a message that is not
// JSON-RPC, an event too large): resuming it would not help.
type brokenStream struct{ error }

func (b brokenStream) Unwrap() error { return b.error }

// resumable reports whether req's stream may be resumed: neither req nor the session is
// of a stateless revision.
func (c *httpConn) resumable(req *jsonrpc.Request) bool {
	c.mu.Lock()
	rev := c.protocol
	c.mu.Unlock()
	return !Stateless(ReadMeta(req.Params).Version) && !Stateless(rev)
}

// resume reads the rest of req's answer after its stream ended (ended says how) without
// it: while cur has an event id, it waits the stream's retry time and resumes the stream
// with a GET carrying Last-Event-ID, reading each resumed stream with read, within the
// bounds of MaxRetry and MaxResumes, until the answer comes. It stops, returning the
// reason, when the stream cannot be resumed (no event id, a refusal, a stateless
// revision), req is cancelled (cancelled closes) or the connection closes.
func (c *httpConn) resume(req *jsonrpc.Request, cur *sseCursor, ended error, cancelled <-chan struct{}, read func(io.Reader, *sseCursor) (bool, error)) (bool, error) {
	switch {
	case !c.resumable(req):
		return false, fmt.Errorf("the stream ended before the answer (%v); a stateless request's stream is not resumed", ended)
	case cur.lastID == "":
		return false, fmt.Errorf("the stream ended before the answer (%v), without an event id to resume it from", ended)
	}
	failures := 0
	for {
		if failures >= MaxResumes {
			return false, fmt.Errorf("the stream ended before the answer (%v), and %d attempts in a row to resume it brought nothing", ended, failures)
		}
		d := cur.wait(failures, c.backoff)
		if d > MaxRetry {
			return false, fmt.Errorf("the stream ended before the answer (%v); the upstream asks to reconnect after %v, longer than the proxy waits (%v)", ended, d, MaxRetry)
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-cancelled:
			t.Stop()
			return false, fmt.Errorf("the stream ended before the answer (%v), and the request was cancelled before it was resumed", ended)
		case <-c.ctx.Done():
			t.Stop()
			return false, c.ctx.Err()
		}
		last := cur.lastID
		resp, err := c.get(last)
		if err != nil {
			failures++
			ended = err
			continue
		}
		ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		if resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			ended = fmt.Errorf("resuming it with Last-Event-ID %q: HTTP status %d (%s)", last, resp.StatusCode, ct)
			if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
				failures++
				continue
			}
			return false, ended // the upstream cannot resume it
		}
		answered, err := read(resp.Body, cur)
		resp.Body.Close()
		if answered {
			return true, nil
		}
		ended = err
		switch {
		case cur.lastID == "":
			return false, fmt.Errorf("the resumed stream ended before the answer (%v) and cleared its event id", err)
		case cur.lastID == last:
			failures++
		default:
			failures = 0
		}
	}
}

// get opens a GET stream of the session, resuming the one of lastID when it is not "". A
// 404 to a request carrying the session id fails the connection (ErrUpstreamSession).
func (c *httpConn) get(lastID string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(c.ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return nil, err
	}
	c.setHeaders(req)
	req.Header.Set("Accept", "text/event-stream")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, c.scrub(err)
	}
	if resp.StatusCode == http.StatusNotFound && req.Header.Get("Mcp-Session-Id") != "" {
		c.fail(fmt.Errorf("%w (HTTP 404 from %s)", ErrUpstreamSession, c.name))
	}
	return resp, nil
}

// watchCancel returns a channel closed when the host or the proxy cancels request id
// (notifications/cancelled written upstream) while it is in flight; unwatchCancel
// forgets it.
func (c *httpConn) watchCancel(id jsonrpc.ID) <-chan struct{} {
	ch := make(chan struct{})
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancels == nil {
		c.cancels = map[string]chan struct{}{}
	}
	c.cancels[idKey(id)] = ch
	return ch
}

func (c *httpConn) unwatchCancel(id jsonrpc.ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.cancels, idKey(id))
}

// noteCancel closes the watch of the request a notifications/cancelled names, if any.
func (c *httpConn) noteCancel(params json.RawMessage) {
	id, ok := CancelledID(params)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch, ok := c.cancels[idKey(id)]; ok {
		close(ch)
		delete(c.cancels, idKey(id))
	}
}

var errStop = errors.New("stop")
