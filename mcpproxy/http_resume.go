package mcpproxy

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// Resumable streams for hosts of sessions (MCP 2025-11-25, "Resumability and Redelivery";
// the stateless 2026-07-28 revision has none, SEP-2575, and its streams get no ids). Every
// SSE stream of a session, a POST's or the GET stream, has a number; its events have ids
// "NUMBER_INDEX". A stream of a host that speaks 2025-11-25 starts with a priming event
// (id NUMBER_0, retry hostRetry, no data). When the host's connection drops before the
// stream is complete, the stream lives on without one: its answers and progress still
// queue on it, and a GET with Last-Event-ID resumes it, replaying what came after that
// event. The session keeps at most maxRetained streams without a connection, holding at
// most maxStreamBytes in all (the oldest are dropped first); each stream keeps what its
// writers took while it fits the stream's own bounds (maxStreamMessages, maxStreamBytes),
// beside what it queues.

// hostRetry is the reconnection time the proxy gives hosts in its priming events.
const hostRetry = time.Second

// maxRetained bounds the streams of a session kept without a connection for a host to
// resume (their bytes together are bounded by maxStreamBytes).
const maxRetained = 16

// eventID is the id of event idx of stream num.
func eventID(num, idx int) string { return strconv.Itoa(num) + "_" + strconv.Itoa(idx) }

// parseEventID returns the stream number and index of an event id; ok is false when id
// is not one the proxy writes.
func parseEventID(id string) (num, idx int, ok bool) {
	a, b, found := strings.Cut(id, "_")
	n, err1 := strconv.Atoi(a)
	i, err2 := strconv.Atoi(b)
	if !found || err1 != nil || err2 != nil || n <= 0 || i < 0 {
		return 0, 0, false
	}
	return n, i, true
}

// resumable numbers st, a new stream of the session served to r, registers it for
// resumption and marks it attached to its first writer; st primes when r's
// Mcp-Protocol-Version is 2025-11-25 or later (an older host may not expect an event
// without data). Called under c.mu.
func (c *downConn) resumable(st *sseStream, r *http.Request) {
	c.lastNum++
	st.num = c.lastNum
	st.attached = true
	v := r.Header.Get("Mcp-Protocol-Version")
	st.prime = v >= transport.Rev20251125 && !transport.Stateless(v)
	c.streams[st.num] = st
}

// detach is called when writer gen of st returns. A resumable stream that is not over
// loses its connection but is kept for the host to resume (retained); any other is
// forgotten. A writer that was taken over leaves st to its successor.
func (c *downConn) detach(st *sseStream, gen int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st.mu.Lock()
	current := st.writer == gen
	if current {
		st.attached = false
	}
	keep := st.num > 0 && !st.ended
	// A stream without ids ends with its request: when the request ended while answers
	// were still due (and neither the proxy ended the stream nor the session ended), the
	// host stopped waiting for them.
	abandoned := 0
	if st.num == 0 && !st.ended {
		abandoned = len(st.waiting)
	}
	st.mu.Unlock()
	switch {
	case !current:
		return
	case !keep || c.isClosed():
		if abandoned > 0 && !c.isClosed() {
			c.log.Info("toolfence proxy: the host stopped waiting for answers (it cancelled or closed its request); when they come they are dropped, and a protected call's outcome is still recorded in the ledger",
				"session", c.id, "answers", abandoned)
		}
		c.forgetLocked(st)
		return
	}
	c.recent = slices.DeleteFunc(c.recent, func(s *sseStream) bool { return s == st })
	if c.standalone == st {
		// Messages for the host go to its other streams meanwhile; the ones this stream
		// queued but never wrote too (a resumption replays only what was written).
		c.standalone = nil
		st.mu.Lock()
		q := st.queue
		st.queue = nil
		for _, e := range q {
			st.bytes -= len(e.data)
		}
		st.mu.Unlock()
		for _, e := range q {
			if len(c.pending) < maxPending {
				c.pending = append(c.pending, e.data)
			}
		}
	}
	c.retained = append(c.retained, st)
	c.trimRetained()
}

// heldWithout keeps the session's retained streams within their bounds after a message
// was pushed to st, and forgets st when it overflowed without a connection. Called under
// c.mu.
func (c *downConn) heldWithout(st *sseStream) {
	st.mu.Lock()
	retained, ended := st.num > 0 && !st.attached, st.ended
	st.mu.Unlock()
	if !retained || !slices.Contains(c.retained, st) {
		return
	}
	if ended {
		c.forgetLocked(st)
		return
	}
	c.trimRetained()
}

// trimRetained forgets the oldest retained streams while there are more than maxRetained
// or they hold more than maxStreamBytes (the newest is kept). Called under c.mu.
func (c *downConn) trimRetained() {
	for len(c.retained) > 1 {
		total := 0
		for _, s := range c.retained {
			total += s.size()
		}
		if len(c.retained) <= maxRetained && total <= maxStreamBytes {
			return
		}
		c.forgetLocked(c.retained[0])
	}
}

// resumeGET resumes the stream of r's Last-Event-ID: it replays the events of that stream
// after that one, then goes on writing the stream until it is complete (a GET stream,
// until the host goes away). A writer still attached to the stream is stopped (the host
// left it). An id this session does not hold (malformed, of a stream it dropped, or older
// than the events the stream still keeps) gets 400, not 404: the session lives on.
func (c *downConn) resumeGET(w http.ResponseWriter, r *http.Request) {
	last := r.Header.Get("Last-Event-ID")
	num, idx, ok := parseEventID(last)
	c.mu.Lock()
	st := c.streams[num]
	why := ""
	gen := 0
	switch {
	case !ok:
		why = "it is not an event id of this proxy"
	case st == nil:
		why = "this session holds no stream of it (a session keeps at most " + strconv.Itoa(maxRetained) + " streams without a connection, " +
			strconv.Itoa(maxStreamBytes>>20) + " MiB in all)"
	default:
		gen, why = st.resume(idx)
	}
	if why != "" {
		c.mu.Unlock()
		http.Error(w, fmt.Sprintf("toolfence proxy: cannot resume the stream of Last-Event-ID %q: %s; open a new stream (GET without Last-Event-ID) or repeat the request", last, why),
			http.StatusBadRequest)
		return
	}
	c.retained = slices.DeleteFunc(c.retained, func(s *sseStream) bool { return s == st })
	if st.get {
		if c.standalone != nil && c.standalone != st {
			c.standalone.end()
		}
		c.standalone = st
		c.flushPending(st)
	} else if !slices.Contains(c.recent, st) {
		c.recent = append(c.recent, st)
	}
	c.mu.Unlock()
	defer c.detach(st, gen)
	w.Header().Set("Mcp-Session-Id", c.id)
	c.stream(w, r, st, gen, func() {})
}

// resume makes st's events after idx its queue again (those up to idx the host has: they
// are dropped) and attaches a new writer, stopping the one attached, if any. It returns
// the new writer's generation, or why st cannot be resumed from idx.
func (s *sseStream) resume(idx int) (gen int, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.ended:
		return 0, "the stream has ended"
	case idx > s.next:
		return 0, "the stream has no such event yet"
	case idx < s.trimmed:
		return 0, "the events after it are no longer held (a stream keeps at most " + strconv.Itoa(maxStreamMessages) + " events, " +
			strconv.Itoa(maxStreamBytes>>20) + " MiB, with those not yet sent)"
	}
	var replay []event
	for _, e := range s.log {
		if e.idx > idx {
			replay = append(replay, e)
		} else {
			s.bytes -= len(e.data)
		}
	}
	s.queue = append(replay, s.queue...)
	s.log = nil
	s.trimmed = idx
	if s.attached {
		close(s.stop)
	}
	s.stop = make(chan struct{})
	s.writer++
	s.attached = true
	s.wake()
	return s.writer, ""
}
