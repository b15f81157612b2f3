package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// lineConn is the MCP stdio framing (one JSON-RPC message per line) over a reader and a
// writer, as mcp.IOTransport makes it, but decoding each line once with encoding/json
// (decodeMessage) and on the reading goroutine itself: the SDK's connection first tries
// every message as a batch, its JSON decoder allocates and clears a large buffer per call,
// and it hands each message from a reading goroutine of its own to the caller of Read; the
// three took most of a relaying proxy's added time (measured in internal/checks/proxybench). A
// batch (a line holding an array) is read as its messages, one after the other. Read must
// not be called concurrently with itself; Close and Writes may be called from any goroutine.
type lineConn struct {
	src    io.Reader // what r reads: its read deadline, when it has one, interrupts a Read
	r      *bufio.Reader
	w      io.Writer
	closer func() error // closes the underlying streams; nil: nothing to close
	wmu    sync.Mutex
	closed chan struct{}
	once   sync.Once
	queue  []jsonrpc.Message // the rest of a batch; used by Read only
	raw    []byte            // the line of the message Read returned last, when it held only that one
	// watched is the ctx whose end interrupts src (see Read); unwatch undoes that; gen
	// counts the watches (under dmu), so that only the current one sets the deadline.
	watched context.Context
	unwatch func() bool
	dmu     sync.Mutex
	gen     uint64
}

// deadliner is a reader whose pending Read a deadline ends: a pipe or socket *os.File read
// through the runtime poller.
type deadliner interface{ SetReadDeadline(time.Time) error }

var _ mcp.Connection = (*lineConn)(nil)

// newLineConn reads messages from r and writes them to w; closer, when set, is called once
// by Close, and should close r so that a pending Read ends.
func newLineConn(r io.Reader, w io.Writer, closer func() error) *lineConn {
	return &lineConn{src: r, r: bufio.NewReaderSize(r, 64<<10), w: w, closer: closer, closed: make(chan struct{})}
}

// readLine returns the next line without its newline; a last line without a newline is
// returned with a nil error, then io.EOF. A line longer than limit is an error.
func readLine(r *bufio.Reader, limit int) ([]byte, error) {
	var buf []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(buf)+len(frag) > limit {
			return nil, fmt.Errorf("mcpproxy: a message longer than %d bytes", limit)
		}
		switch {
		case err == nil && buf == nil:
			return bytes.Clone(frag[:len(frag)-1]), nil
		case err == nil:
			return append(buf, frag[:len(frag)-1]...), nil
		case errors.Is(err, bufio.ErrBufferFull):
			buf = append(buf, frag...)
		default:
			buf = append(buf, frag...)
			if len(bytes.TrimSpace(buf)) > 0 {
				return buf, nil // the next call returns err
			}
			return nil, err
		}
	}
}

// decodeLine decodes one line: a message, or a batch (an array of messages).
func decodeLine(line []byte) ([]jsonrpc.Message, error) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return nil, nil
	}
	if line[0] != '[' {
		msg, err := decodeMessage(line)
		if err != nil {
			return nil, err
		}
		return []jsonrpc.Message{msg}, nil
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(line, &raws); err != nil {
		return nil, err
	}
	if len(raws) == 0 {
		return nil, errors.New("mcpproxy: an empty JSON-RPC batch")
	}
	msgs := make([]jsonrpc.Message, 0, len(raws))
	for _, raw := range raws {
		msg, err := decodeMessage(raw)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, msg)
	}
	return msgs, nil
}

// wireMsg is a JSON-RPC 2.0 message on the wire.
type wireMsg struct {
	Version string          `json:"jsonrpc"`
	ID      any             `json:"id"`
	Method  *string         `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   *jsonrpc.Error  `json:"error"`
}

// decodeMessage decodes one JSON-RPC message as jsonrpc.DecodeMessage does: a request when
// it has a method, else a response, which needs an id; the version must be "2.0". (Keys
// match case-insensitively here; what the proxy relays is its own encoding of what it
// decoded, so upstream sees the same message the proxy judged.)
func decodeMessage(data []byte) (jsonrpc.Message, error) {
	var w wireMsg
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, fmt.Errorf("mcpproxy: unmarshaling jsonrpc message: %w", err)
	}
	if w.Version != "2.0" {
		return nil, fmt.Errorf("mcpproxy: invalid message version tag %q; expected \"2.0\"", w.Version)
	}
	id, err := jsonrpc.MakeID(w.ID)
	if err != nil {
		return nil, err
	}
	if w.Method != nil {
		return &jsonrpc.Request{Method: *w.Method, ID: id, Params: w.Params}, nil
	}
	if !id.IsValid() {
		return nil, errors.New("mcpproxy: a JSON-RPC message with neither a method nor an id")
	}
	r := &jsonrpc.Response{ID: id, Result: w.Result}
	if w.Error != nil {
		r.Error = w.Error
	}
	return r, nil
}

// Read returns the next message, read on the calling goroutine; io.EOF once the reader
// ended or the connection is closed. When ctx ends, a pending Read returns ctx's error if
// the reader has a read deadline (a pipe or socket read through the poller: the upstream's
// pipe, Stdio's duplicates); the connection is then done (a line may have been cut). For
// other readers ctx is checked before reading, and a pending Read ends on Close only when
// the closer closes the reader.
func (c *lineConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if d, ok := c.src.(deadliner); ok && ctx != c.watched && (ctx.Done() != nil || c.watched != nil) {
		// Once per context, not per Read: Serve reads a whole session under one. The
		// watch of the last context is undone under dmu, and a watch that fires late (its
		// context ended while this one began) sees that it is no longer the current one.
		c.dmu.Lock()
		if c.unwatch != nil {
			c.unwatch()
			c.unwatch = nil
		}
		c.gen++
		gen := c.gen
		_ = d.SetReadDeadline(time.Time{}) // the last context may have ended: read again
		c.dmu.Unlock()
		c.watched = ctx
		if ctx.Done() != nil {
			c.unwatch = context.AfterFunc(ctx, func() {
				c.dmu.Lock()
				defer c.dmu.Unlock()
				if c.gen == gen {
					_ = d.SetReadDeadline(time.Unix(1, 0))
				}
			})
		}
	}
	c.raw = nil
	if len(c.queue) > 0 {
		m := c.queue[0]
		c.queue = c.queue[1:]
		return m, nil
	}
	for {
		select {
		case <-c.closed:
			return nil, io.EOF
		default:
		}
		line, err := readLine(c.r, mcp.DefaultMaxLineLength)
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr // interrupted (the line, if any, may be cut)
		}
		if err != nil && len(line) == 0 {
			select {
			case <-c.closed:
				return nil, io.EOF // the closer closed the reader under this Read
			default:
				return nil, err
			}
		}
		line = bytes.TrimSpace(line)
		msgs, err := decodeLine(line)
		if err != nil {
			return nil, &BadLineError{err: err, line: line}
		}
		if len(msgs) == 0 {
			continue // a blank line
		}
		c.queue = msgs[1:]
		if len(msgs) == 1 {
			c.raw = line
		}
		return msgs[0], nil
	}
}

// BadLineError is the error of a Read (of Stdio's or an Upstream's connection) whose line
// could not be taken as JSON-RPC messages (not JSON, not a message). The line is consumed:
// the connection can be read on. It wraps the decoding error.
type BadLineError struct {
	err  error
	line []byte
}

func (e *BadLineError) Error() string { return e.err.Error() }
func (e *BadLineError) Unwrap() error { return e.err }

// Head returns the start of the line (at most 120 bytes, then "…"), for a log.
func (e *BadLineError) Head() string {
	const n = 120
	if len(e.line) > n {
		return string(e.line[:n]) + "…"
	}
	return string(e.line)
}

// Write writes msg as one line.
func (c *lineConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	return c.writeRaw(data)
}

// lastRaw returns the line of the message Read returned last, as it was read (without its
// newline), or nil when that message came in a batch. It is valid until the next Read.
func (c *lineConn) lastRaw() []byte { return c.raw }

// writeRaw writes line (one encoded message, or one as another lineConn read it: lastRaw)
// and a newline, unless the connection is closed.
func (c *lineConn) writeRaw(line []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.closed:
		return errors.New("mcpproxy: write on a closed connection")
	default:
	}
	_, err := c.w.Write(append(line, '\n'))
	return err
}

// Close ends a pending Read and closes the underlying streams (once).
func (c *lineConn) Close() error {
	var err error
	c.once.Do(func() {
		close(c.closed)
		if c.closer != nil {
			err = c.closer()
		}
	})
	return err
}

// SessionID is "": a stdio connection has no session id.
func (c *lineConn) SessionID() string { return "" }

// RelayRaw writes to dst the line of the message src's last Read returned, as src read it,
// when both are line connections of this package (Stdio, Upstream.Conn) and that message
// came alone on its line: relayed that way a message is not encoded again. It reports
// whether it took the message: false, nothing was written (the caller writes msg itself);
// true, the error is the write's, or ctx's when it ended.
func RelayRaw(ctx context.Context, dst, src mcp.Connection) (bool, error) {
	s, ok := src.(*lineConn)
	if !ok {
		return false, nil
	}
	d, ok := dst.(*lineConn)
	if !ok {
		return false, nil
	}
	raw := s.lastRaw()
	if raw == nil {
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return true, err
	}
	return true, d.writeRaw(raw)
}
