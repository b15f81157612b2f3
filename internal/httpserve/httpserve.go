// Package httpserve is the one set-up of toolfence's HTTP servers (serve --http and proxy
// --http): timeouts and caps on open connections (in all and per
// peer address) that never
// cut a long-lived response stream, the refusal of requests a web page makes a browser send
// (CheckBrowser), of JSON bodies too deep or too large in values to decode (CheckShape), and
// the count of requests in progress per token and in all (InFlight). It imports nothing of
// toolfence.
package httpserve

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// Defaults of Limits.
const (
	// DefaultMaxConns caps the connections open at once (idle keep-alive ones included).
	DefaultMaxConns = 1024
	// DefaultMaxConnsPerPeer caps the connections one peer address holds at once.
	DefaultMaxConnsPerPeer = 256
	// DefaultIdleTimeout closes a keep-alive connection that sends no request for this long.
	DefaultIdleTimeout = 60 * time.Second
	// DefaultReadHeaderTimeout bounds reading a request's headers.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultReadTimeout bounds reading a whole request (headers and body).
	DefaultReadTimeout = 30 * time.Second
)

// Limits bounds what clients can make an HTTP server hold. The zero value of each field
// means its default. No limit applies to writing a response: a response stream (SSE) lives
// as long as its handler writes to it.
type Limits struct {
	// MaxConns caps the connections open at once; further ones wait in the kernel's
	// accept queue until one closes. Defaults to DefaultMaxConns.
	MaxConns int
	// MaxConnsPerPeer caps the connections one peer address (IP) holds at once; a
	// connection past it is closed when accepted. Defaults to the smaller of
	// DefaultMaxConnsPerPeer and MaxConns.
	MaxConnsPerPeer int
	// IdleTimeout closes a keep-alive connection idle between requests for this long.
	// Defaults to DefaultIdleTimeout.
	IdleTimeout time.Duration
	// ReadHeaderTimeout bounds reading a request's headers. Defaults to
	// DefaultReadHeaderTimeout.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a request, headers and body, from its first byte.
	// net/http lifts the deadline once the body has been read to its end, so it never ends
	// a handler that streams its response. Defaults to DefaultReadTimeout.
	ReadTimeout time.Duration
}

// ErrInvalid is wrapped by Validate's errors.
var ErrInvalid = errors.New("httpserve: invalid limits")

// WithDefaults returns l with every zero field set to its default.
func (l Limits) WithDefaults() Limits {
	l.MaxConns = cmp.Or(l.MaxConns, DefaultMaxConns)
	l.MaxConnsPerPeer = cmp.Or(l.MaxConnsPerPeer, min(DefaultMaxConnsPerPeer, l.MaxConns))
	l.IdleTimeout = cmp.Or(l.IdleTimeout, DefaultIdleTimeout)
	l.ReadHeaderTimeout = cmp.Or(l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	l.ReadTimeout = cmp.Or(l.ReadTimeout, DefaultReadTimeout)
	return l
}

// Validate returns an error wrapping ErrInvalid naming the first negative field, or a
// ReadHeaderTimeout longer than ReadTimeout; nil otherwise (zero fields are defaults).
func (l Limits) Validate() error {
	switch {
	case l.MaxConns < 0:
		return fmt.Errorf("%w: max connections %d is negative", ErrInvalid, l.MaxConns)
	case l.MaxConnsPerPeer < 0:
		return fmt.Errorf("%w: max connections per peer %d is negative", ErrInvalid, l.MaxConnsPerPeer)
	case l.IdleTimeout < 0:
		return fmt.Errorf("%w: idle timeout %v is negative", ErrInvalid, l.IdleTimeout)
	case l.ReadHeaderTimeout < 0:
		return fmt.Errorf("%w: read header timeout %v is negative", ErrInvalid, l.ReadHeaderTimeout)
	case l.ReadTimeout < 0:
		return fmt.Errorf("%w: read timeout %v is negative", ErrInvalid, l.ReadTimeout)
	}
	d := l.WithDefaults()
	if d.ReadHeaderTimeout > d.ReadTimeout {
		return fmt.Errorf("%w: read header timeout %v exceeds the read timeout %v", ErrInvalid, d.ReadHeaderTimeout, d.ReadTimeout)
	}
	return nil
}

// Server returns an http.Server serving h under l (defaults for zero fields). Serve it on
// Listener's result so that MaxConns holds.
func (l Limits) Server(h http.Handler) *http.Server {
	l = l.WithDefaults()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		IdleTimeout:       l.IdleTimeout,
		// No WriteTimeout: it would end notification streams.
	}
}

// Listener returns ln accepting at most MaxConns connections at once, and at most
// MaxConnsPerPeer of one peer address (the others are closed when accepted, taking no slot).
func (l Limits) Listener(ln net.Listener) net.Listener {
	l = l.WithDefaults()
	return netutil.LimitListener(&perPeer{Listener: ln, max: l.MaxConnsPerPeer, open: map[string]int{}}, l.MaxConns)
}
