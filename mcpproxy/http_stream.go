package mcpproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// maxPending bounds the messages of a session waiting for a stream to carry them.
const maxPending = 1024

// maxStreamMessages and maxStreamBytes bound the queue of one stream (a POST's or the GET
// stream): the messages the proxy took for the host that the host has not read yet. A
// message that would pass either bound is not queued, but a queue that is empty takes one
// message of any size (up to transport.MaxUpstreamMessage). When a stream is full, a
// notification for it is dropped (counted, and logged once per stream); an answer to a
// request, or a request of upstream (sampling, elicitation), drops the queued
// notifications, and when it still does not fit ends the stream, so the host sees it close
// and reconnects: the answers it held are lost (logged; a protected call's outcome is in
// the ledger), its requests wait for the next stream. A jsonOnly stream is not bounded: it
// holds only the answers to its own POST.
const (
	maxStreamMessages = 1024
	maxStreamBytes    = 8 << 20
)

// downConn is the proxy's connection to one host session over HTTP: Read gives what the
// host POSTs, Write routes each message to an HTTP response (see HTTPServer). Write never
// blocks on the host and never fails but after Close, so a host that went away cannot stop
// the relay.
type downConn struct {
	id        string
	log       *slog.Logger
	stateless bool // one stateless request: no session id; a protocol error gets its status
	incoming  chan jsonrpc.Message
	once      sync.Once
	done      chan struct{}

	mu         sync.Mutex
	byRequest  map[string]*sseStream // hostKey of a request → the stream of its POST
	byProgress map[string]*sseStream // progress token → the stream of its request
	standalone *sseStream            // the GET stream, if open
	recent     []*sseStream          // open POST streams, oldest first
	pending    [][]byte              // messages no stream could take yet
	// Resumption (a session's SSE streams; see http_resume.go).
	streams  map[int]*sseStream // resumable streams by number: attached, detached or retained
	retained []*sseStream       // streams without a connection a host may resume, oldest first
	lastNum  int                // number of the session's newest stream
}

var _ mcp.Connection = (*downConn)(nil)

func newDownConn(id string, log *slog.Logger) *downConn {
	return &downConn{id: id, log: log, incoming: make(chan jsonrpc.Message, 64), done: make(chan struct{}),
		byRequest: map[string]*sseStream{}, byProgress: map[string]*sseStream{}, streams: map[int]*sseStream{}}
}

// SessionID returns the session's Mcp-Session-Id.
func (c *downConn) SessionID() string { return c.id }

// Read returns the next message the host posted; io.EOF once the session ended.
func (c *downConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case m := <-c.incoming:
		return m, nil
	case <-c.done:
		return nil, io.EOF
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close ends the session: Read returns io.EOF, open streams end.
func (c *downConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return nil
}

func (c *downConn) isClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// WriteAnswer writes the proxy's own answer to a host request as Write does, and reports
// whether it reached a stream the host still reads (false: it was dropped, the host no
// longer waits for it, the session ended, or the stream's connection dropped: kept for the
// host to resume, the answer may never be read, so it does not count as the host's).
// delivered, when not nil, is called before the answer is queued for a stream the host
// reads, under the lock that routes answers: so it is never called for a request the proxy
// already knows the host stopped waiting for, and it is called before the host can read
// the answer. (The answer may still fail to queue after it; WriteAnswer then returns false.)
func (c *downConn) WriteAnswer(_ context.Context, r *jsonrpc.Response, delivered func()) bool {
	if c.isClosed() {
		return false
	}
	data, err := jsonrpc.EncodeMessage(r)
	if err != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := hostKey(r.ID)
	st := c.byRequest[k]
	delete(c.byRequest, k)
	live := st != nil && st.live()
	if live && delivered != nil {
		delivered()
	}
	if st == nil || st.push(data, k, false) != pushed {
		c.log.Warn("toolfence proxy: an answer for the host was dropped: the host no longer waits for it (its outcome is in the ledger)", "session", c.id)
		return false
	}
	return live
}

// live reports whether a host connection reads s: a stream without ids lives as long as its
// request (it ends with it); a resumable one only while a writer is attached.
func (s *sseStream) live() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.num == 0 || s.attached
}

// Write routes msg to the host: an answer to the stream of its request (dropped, with a
// log line, when the host no longer waits on it); a progress notification to the stream of
// the request that gave its token; anything else to the GET stream, else the most recent
// open request stream, else the pending queue. It returns an error only after Close.
func (c *downConn) Write(_ context.Context, msg jsonrpc.Message) error {
	if c.isClosed() {
		return errors.New("mcpproxy: the host session has ended")
	}
	data, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := msg.(*jsonrpc.Response); ok {
		k := hostKey(r.ID)
		st := c.byRequest[k]
		delete(c.byRequest, k)
		switch {
		case st == nil:
			c.log.Warn("toolfence proxy: an answer for the host was dropped: the host no longer waits for it (its outcome is in the ledger)", "session", c.id)
		default:
			switch st.push(data, k, false) {
			case refused:
				c.log.Warn("toolfence proxy: an answer for the host was dropped: the host no longer waits for it (its outcome is in the ledger)", "session", c.id)
			case overflowed:
				c.log.Warn("toolfence proxy: an answer for the host was dropped and its stream ended: the host does not read the stream, whose queue is full (its outcome is in the ledger)",
					"session", c.id, "queued", maxStreamMessages, "bytes", maxStreamBytes)
			}
			c.heldWithout(st)
		}
		return nil
	}
	req, _ := msg.(*jsonrpc.Request)
	note := req != nil && !req.IsCall() // may be dropped when its stream is full
	deliver := func(st *sseStream) bool {
		defer c.heldWithout(st)
		switch st.push(data, "", note) {
		case pushed:
			return true
		case dropped:
			if st.droppedCount() == 1 {
				c.log.Warn("toolfence proxy: notifications for the host are dropped: the host does not read its stream, whose queue is full", "session", c.id,
					"queued", maxStreamMessages, "bytes", maxStreamBytes)
			}
			return true
		case overflowed:
			c.log.Warn("toolfence proxy: a stream to the host was ended: the host does not read it and its queue is full; the host must reconnect", "session", c.id)
		}
		return false
	}
	if req != nil && req.Method == "notifications/progress" {
		var p struct {
			Token any `json:"progressToken"`
		}
		if json.Unmarshal(req.Params, &p) == nil && p.Token != nil {
			if st := c.byProgress[fmt.Sprint(p.Token)]; st != nil && deliver(st) {
				return nil
			}
		}
	}
	if c.standalone != nil && deliver(c.standalone) {
		return nil
	}
	for i := len(c.recent) - 1; i >= 0; i-- {
		if deliver(c.recent[i]) {
			return nil
		}
	}
	if len(c.pending) >= maxPending {
		c.pending = c.pending[1:]
		c.log.Warn("toolfence proxy: a message for the host was dropped: no stream open to carry it", "session", c.id)
	}
	c.pending = append(c.pending, data)
	return nil
}

// sseStream is one HTTP response carrying messages to the host. A stream of a session
// is resumable (num > 0): its events have ids, and the events its writers took stay in
// its log, so that a host whose connection dropped can resume it with a GET carrying
// Last-Event-ID (http_resume.go); the queue and the log share its bounds.
type sseStream struct {
	mu      sync.Mutex
	queue   []event         // not yet taken by a writer
	log     []event         // taken by a writer, oldest first (resumable streams only)
	bytes   int             // of queue and log, at most maxStreamBytes (but for one message)
	trimmed int             // the index of the newest event dropped from log: no resuming before it
	dropped int             // notifications dropped because queue was full
	stop    chan struct{}   // closed when its writer must stop at once: overflow, or taken over
	waiting map[string]bool // answers it still carries (none for GET)
	ended   bool            // no more messages: it is done or its request is gone
	// jsonOnly: the host takes one JSON body of answers; other messages go elsewhere.
	jsonOnly bool
	signal   chan struct{}
	// num is the stream's number in its session (its event ids are "num_index"); 0 when it
	// has no ids: a stateless request's, a JSON body.
	num   int
	next  int  // index of its newest event (the priming event is 0)
	prime bool // its host speaks 2025-11-25 or later: the first writer sends a priming event
	get   bool // the session's GET stream
	// writer counts the writers attached in turn (a resumption takes the stream over);
	// attached says whether the newest one still writes.
	writer   int
	attached bool
}

// event is one message of a stream for the host: its index (its event id with the
// stream's number; 0 in a stream without ids) and whether it is a notification.
type event struct {
	data []byte
	note bool
	idx  int
}

func newStream() *sseStream {
	return &sseStream{waiting: map[string]bool{}, signal: make(chan struct{}, 1), stop: make(chan struct{})}
}

// pushResult is what push did with a message.
type pushResult int

const (
	pushed     pushResult = iota // queued
	refused                      // the stream has ended or is complete: nothing done
	dropped                      // the queue is full: the notification was dropped (counted)
	overflowed                   // the queue is full of what must be delivered: the stream is ended
)

// push queues data; answer is the hostKey data answers ("" for other messages), note says
// data is a notification. Room is made first by dropping the oldest events of the log
// (the replay of a resumption reaches back less far). When the queue is still full
// (maxStreamMessages, maxStreamBytes) a notification is dropped; any other message first
// drops the queued notifications, and when it still does not fit, ends the stream: what
// it queued stays for leftovers (forget sends its requests on the next stream) and data
// is not queued. A jsonOnly stream holds only the answers to its own POST and is not
// bounded here.
func (s *sseStream) push(data []byte, answer string, note bool) pushResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended || (s.waiting != nil && len(s.waiting) == 0) || (s.jsonOnly && answer == "") {
		return refused
	}
	if !s.jsonOnly {
		s.trimLog(len(data))
		if s.full(len(data)) {
			if note {
				s.dropped++
				return dropped
			}
			s.dropNotes()
			if s.full(len(data)) {
				s.ended = true
				close(s.stop)
				s.wake()
				return overflowed
			}
		}
	}
	e := event{data: data, note: note}
	if s.num > 0 {
		s.next++
		e.idx = s.next
	}
	s.queue = append(s.queue, e)
	s.bytes += len(data)
	if answer != "" {
		delete(s.waiting, answer)
	}
	s.wake()
	return pushed
}

// full reports whether n more bytes do not fit the queue (an empty queue takes anything).
func (s *sseStream) full(n int) bool {
	return len(s.queue) > 0 && (len(s.queue) >= maxStreamMessages || s.bytes+n > maxStreamBytes)
}

// trimLog drops the oldest events of the log until n more bytes fit the stream's bounds
// beside the queue, or the log is empty.
func (s *sseStream) trimLog(n int) {
	for len(s.log) > 0 && (len(s.queue)+len(s.log) >= maxStreamMessages || s.bytes+n > maxStreamBytes) {
		s.bytes -= len(s.log[0].data)
		s.trimmed = s.log[0].idx
		s.log[0] = event{}
		s.log = s.log[1:]
	}
}

// dropNotes drops the queued notifications, counting them.
func (s *sseStream) dropNotes() {
	q := s.queue[:0]
	for _, e := range s.queue {
		if e.note {
			s.dropped++
			s.bytes -= len(e.data)
			continue
		}
		q = append(q, e)
	}
	clear(s.queue[len(q):])
	s.queue = q
}

// wake tells the writer there is something to do.
func (s *sseStream) wake() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// droppedCount is the number of notifications dropped because the queue was full.
func (s *sseStream) droppedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// size is the bytes the stream holds (queue and log).
func (s *sseStream) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// take returns the queued messages for writer gen (moving them to the log of a resumable
// stream) and whether the stream is complete: every answer has come, or it was ended. A
// writer that was taken over (gen is not the newest) gets nothing and complete.
func (s *sseStream) take(gen int) ([]event, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.writer {
		return nil, true
	}
	q := s.queue
	s.queue = nil
	if s.num > 0 {
		s.log = append(s.log, q...)
	} else {
		for _, e := range q {
			s.bytes -= len(e.data)
		}
	}
	return q, s.ended || (s.waiting != nil && len(s.waiting) == 0)
}

// unshift puts q (taken by take from a stream without ids) back at the front of the queue.
func (s *sseStream) unshift(q []event) {
	if len(q) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range q {
		s.bytes += len(e.data)
	}
	s.queue = append(q, s.queue...)
	s.wake()
}

// end makes the stream take no more messages and its writer finish.
func (s *sseStream) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	s.wake()
}

// leftovers ends the stream and returns what no writer took.
func (s *sseStream) leftovers() []event {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	q := s.queue
	s.queue, s.log, s.bytes = nil, nil, 0
	return q
}

// servePOST hands the host's messages to the relay. Without requests among them it
// answers 202; else it streams (SSE, or one JSON body when the host accepts only JSON)
// until every request is answered, the host goes away or the session ends. It calls idle
// once nothing of the request is left to do but writing its last bytes.
func (c *downConn) servePOST(w http.ResponseWriter, r *http.Request, msgs []jsonrpc.Message, batch bool, idle func()) {
	var st *sseStream
	sse := accepts(r, "text/event-stream")
	c.mu.Lock()
	for _, m := range msgs {
		req, ok := m.(*jsonrpc.Request)
		if !ok || !req.IsCall() {
			continue
		}
		if st == nil {
			st = newStream()
			st.jsonOnly = !sse
			if sse && !c.stateless {
				c.resumable(st, r)
			}
		}
		k := hostKey(req.ID)
		st.waiting[k] = true
		c.byRequest[k] = st
		var p struct {
			Meta struct {
				Token any `json:"progressToken"`
			} `json:"_meta"`
		}
		if json.Unmarshal(req.Params, &p) == nil && p.Meta.Token != nil {
			c.byProgress[fmt.Sprint(p.Meta.Token)] = st
		}
	}
	if st != nil && sse {
		c.recent = append(c.recent, st)
		c.flushPending(st)
	}
	c.mu.Unlock()
	if st != nil {
		defer c.detach(st, 0)
	}
	for _, m := range msgs {
		select {
		case c.incoming <- m:
		case <-c.done:
			http.Error(w, "toolfence proxy: the session has ended", http.StatusNotFound)
			return
		case <-r.Context().Done():
			return
		}
	}
	if !c.stateless {
		w.Header().Set("Mcp-Session-Id", c.id)
	}
	if st == nil {
		idle()
		w.WriteHeader(http.StatusAccepted)
		return
	}
	if !sse {
		c.serveJSON(w, r, st, batch, idle)
		return
	}
	c.stream(w, r, st, 0, idle)
}

// serveJSON waits for every answer of st and writes them as one JSON body.
func (c *downConn) serveJSON(w http.ResponseWriter, r *http.Request, st *sseStream, batch bool, idle func()) {
	var all []event
	for {
		q, complete := st.take(0)
		all = append(all, q...)
		if complete {
			break
		}
		select {
		case <-st.signal:
		case <-r.Context().Done():
			return
		case <-c.done:
			http.Error(w, "toolfence proxy: the session has ended", http.StatusNotFound)
			return
		}
	}
	// Only answers were queued on st (jsonOnly).
	answers := make([]json.RawMessage, len(all))
	for i, e := range all {
		answers[i] = e.data
	}
	idle()
	w.Header().Set("Content-Type", "application/json")
	if len(answers) == 1 && !batch {
		if status := c.errorStatus(answers[0]); status != 0 {
			w.WriteHeader(status)
		}
		_, _ = w.Write(answers[0])
		return
	}
	_ = json.NewEncoder(w).Encode(answers)
}

// errorStatus is the status of a stateless request whose whole answer is data, a protocol
// error (transport.ErrorStatus); 0 for any other answer, or in a session.
func (c *downConn) errorStatus(data []byte) int {
	if !c.stateless {
		return 0
	}
	m, err := jsonrpc.DecodeMessage(data)
	if resp, ok := m.(*jsonrpc.Response); err == nil && ok {
		return transport.ErrorStatus(resp)
	}
	return 0
}

// stream writes st's messages as server-sent events, as its writer gen, until st is
// complete, the host goes away, the session ends or a resumption takes st over. A
// resumable stream's events carry ids, and a fresh one of a 2025-11-25 host starts with a
// priming event (an id, the retry time, no data). A stateless request's stream starts
// with its first message: when that is the whole answer and a protocol error, it is
// answered as JSON with the error's status instead.
func (c *downConn) stream(w http.ResponseWriter, r *http.Request, st *sseStream, gen int, idle func()) {
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	for c.stateless {
		q, complete := st.take(gen)
		if len(q) == 0 && !complete {
			select {
			case <-st.signal:
				continue
			case <-r.Context().Done():
				return
			case <-c.done:
				return
			}
		}
		if complete && len(q) == 1 {
			if status := c.errorStatus(q[0].data); status != 0 {
				idle()
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				_, _ = w.Write(q[0].data)
				return
			}
		}
		st.unshift(q) // written below, in order, as events
		break
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	st.mu.Lock()
	num, stop := st.num, st.stop
	prime := st.prime && gen == 0
	st.mu.Unlock()
	if prime {
		_, _ = fmt.Fprintf(w, "id: %s\nretry: %d\ndata: \n\n", eventID(num, 0), hostRetry.Milliseconds())
	}
	flush()
	// A stream that overflowed, or was taken over, ends now, even while a write to a host
	// that does not read blocks: its write deadline passes.
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-stop:
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now())
		case <-finished:
		}
	}()
	for {
		q, complete := st.take(gen)
		if complete {
			idle() // the last answers follow
		}
		for _, e := range q {
			var err error
			if num > 0 {
				_, err = fmt.Fprintf(w, "id: %s\nevent: message\ndata: %s\n\n", eventID(num, e.idx), e.data)
			} else {
				_, err = fmt.Fprintf(w, "event: message\ndata: %s\n\n", e.data)
			}
			if err != nil {
				return
			}
		}
		flush()
		if complete {
			return
		}
		select {
		case <-st.signal:
		case <-stop:
		case <-r.Context().Done():
			return
		case <-c.done:
			return
		}
	}
}

// forget ends st (its writer has returned) and drops it from the routing tables; its
// unanswered requests' answers will be dropped.
func (c *downConn) forget(st *sseStream) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(st)
}

// forgetLocked is forget under c.mu.
func (c *downConn) forgetLocked(st *sseStream) {
	left := st.leftovers()
	if n := st.droppedCount(); n > 0 {
		c.log.Warn("toolfence proxy: a stream to the host ended; notifications were dropped from it while its queue was full", "session", c.id, "dropped", n)
	}
	// What the host never got but answers waits for the next stream (an answer has no
	// other stream to go to: its request's HTTP response is gone).
	answers := 0
	for _, e := range left {
		if m, err := jsonrpc.DecodeMessage(e.data); err == nil {
			if _, answer := m.(*jsonrpc.Response); answer {
				answers++
			} else if len(c.pending) < maxPending {
				c.pending = append(c.pending, e.data)
			}
		}
	}
	if answers > 0 {
		c.log.Warn("toolfence proxy: answers for the host were dropped: their stream ended before the host read them (their outcomes are in the ledger)", "session", c.id, "answers", answers)
	}
	for k, s := range c.byRequest {
		if s == st {
			delete(c.byRequest, k)
		}
	}
	for k, s := range c.byProgress {
		if s == st {
			delete(c.byProgress, k)
		}
	}
	c.recent = slices.DeleteFunc(c.recent, func(s *sseStream) bool { return s == st })
	c.retained = slices.DeleteFunc(c.retained, func(s *sseStream) bool { return s == st })
	if c.streams[st.num] == st {
		delete(c.streams, st.num)
	}
	if c.standalone == st {
		c.standalone = nil
	}
}

// flushPending moves the messages that waited for a stream to st, under c.mu. What st
// cannot take once it overflowed keeps waiting for the next stream.
func (c *downConn) flushPending(st *sseStream) {
	for i, data := range c.pending {
		if st.push(data, "", isNote(data)) == overflowed {
			c.pending = c.pending[i:]
			return
		}
	}
	c.pending = nil
}

// serveGET opens the session's notification stream (replacing an older one) and writes to
// it until the host goes away or the session ends. A GET with Last-Event-ID resumes the
// stream of that event instead (resumeGET).
func (c *downConn) serveGET(w http.ResponseWriter, r *http.Request) {
	if !accepts(r, "text/event-stream") {
		http.Error(w, "toolfence proxy: a GET must accept text/event-stream", http.StatusNotAcceptable)
		return
	}
	if _, ok := r.Header["Last-Event-Id"]; ok {
		c.resumeGET(w, r)
		return
	}
	st := &sseStream{signal: make(chan struct{}, 1), stop: make(chan struct{}), get: true} // waiting nil: never complete
	c.mu.Lock()
	if c.standalone != nil {
		c.standalone.end()
	}
	c.resumable(st, r)
	c.standalone = st
	c.flushPending(st)
	c.mu.Unlock()
	defer c.detach(st, 0)
	w.Header().Set("Mcp-Session-Id", c.id)
	c.stream(w, r, st, 0, func() {}) // released when the handler returns
}

// accepts reports whether r's Accept header lists mediaType (or */*); an absent header
// accepts anything.
func accepts(r *http.Request, mediaType string) bool {
	vals := r.Header.Values("Accept")
	if len(vals) == 0 {
		return true
	}
	for _, v := range vals {
		for _, part := range strings.Split(v, ",") {
			mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err == nil && (mt == mediaType || mt == "*/*") {
				return true
			}
		}
	}
	return false
}

// isNote reports whether data, a message for the host, is a notification (which a full
// stream may drop) rather than an answer or a request of upstream.
func isNote(data []byte) bool {
	m, err := jsonrpc.DecodeMessage(data)
	if err != nil {
		return false
	}
	req, ok := m.(*jsonrpc.Request)
	return ok && !req.IsCall()
}
