package httpserve

import (
	"net"
	"sync"
)

// perPeer is a listener that holds at most max connections of one peer address (its IP, any
// port) at once: a connection past that is closed as soon as it is accepted, so one peer
// that opens connections and sends nothing (slowloris) cannot take the slots that
// MaxConns leaves to every other client.
type perPeer struct {
	net.Listener
	max int

	mu   sync.Mutex
	open map[string]int
}

// Accept returns the next connection whose peer holds fewer than max, closing the others.
func (l *perPeer) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := peerOf(c)
		l.mu.Lock()
		ok := l.open[peer] < l.max
		if ok {
			l.open[peer]++
		}
		l.mu.Unlock()
		if ok {
			return &peerConn{Conn: c, release: func() { l.release(peer) }}, nil
		}
		_ = c.Close()
	}
}

func (l *perPeer) release(peer string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[peer]--; l.open[peer] <= 0 {
		delete(l.open, peer)
	}
}

// peerOf is the address that counts for c: its remote IP (the whole address when it has
// no port, as on a unix socket).
func peerOf(c net.Conn) string {
	a := c.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(a); err == nil {
		return host
	}
	return a
}

// peerConn gives back its peer's slot once, on the first Close.
type peerConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *peerConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
