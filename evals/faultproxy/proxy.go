package faultproxy

import (
	"errors"
	"net"
	"sync"
	"time"
)

// Mode is what the proxy does with traffic.
type Mode int

// Proxy modes.
const (
	// Pass forwards traffic (after any latency and within any bandwidth cap).
	Pass Mode = iota
	// Blackhole keeps every connection open but forwards nothing in either direction, and
	// accepts new connections without connecting them upstream: peers see a timeout.
	Blackhole
)

// Proxy forwards connections accepted on its listener to a target address. The zero value
// is not usable; call Start. It is safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu        sync.Mutex
	cond      *sync.Cond
	mode      Mode
	latency   time.Duration
	bandwidth int // bytes per second per direction; 0 = unlimited
	conns     map[*link]struct{}
	closed    bool

	wg sync.WaitGroup
}

// link is one proxied connection: the accepted client side and the upstream side (nil
// while blackholed before connecting).
type link struct {
	client, server net.Conn
}

// Start listens on listen (host:port, port 0 picks one) and forwards to target. It returns
// an error when it cannot listen.
func Start(listen, target string) (*Proxy, error) {
	if target == "" {
		return nil, errors.New("faultproxy: empty target address")
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[*link]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetLatency delays every forwarded chunk by d (zero turns it off).
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// SetBandwidth caps each direction of each connection to bytesPerSec (zero: unlimited).
func (p *Proxy) SetBandwidth(bytesPerSec int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bandwidth = bytesPerSec
}

// SetMode switches between Pass and Blackhole. Going back to Pass resumes the held
// connections (a short timeout heals; the peers may have given up meanwhile).
func (p *Proxy) SetMode(m Mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
	p.cond.Broadcast()
}

// Partition cuts the network: every open connection is dropped silently (no FIN reaches
// the peers until they give up) and new ones hang. Heal ends it.
func (p *Proxy) Partition() {
	p.mu.Lock()
	p.mode = Blackhole
	old := p.conns
	p.conns = map[*link]struct{}{}
	p.cond.Broadcast()
	p.mu.Unlock()
	// The held connections are forgotten by the forwarders (they see a closed upstream);
	// the client sides stay open and silent until Heal closes them.
	p.mu.Lock()
	for l := range old {
		if l.server != nil {
			_ = l.server.Close()
		}
		p.conns[l] = struct{}{}
	}
	p.mu.Unlock()
}

// Heal returns to Pass with no latency or bandwidth cap. Connections broken by a partition
// are closed, so their peers reconnect.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode, p.latency, p.bandwidth = Pass, 0, 0
	for l := range p.conns {
		if l.server == nil || isClosed(l.server) {
			_ = l.client.Close()
			delete(p.conns, l)
		}
	}
	p.cond.Broadcast()
}

// Reset closes every open connection with a TCP reset (SO_LINGER 0) on the client side.
// It returns how many connections it reset.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.conns {
		if tc, ok := l.client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = l.client.Close()
		if l.server != nil {
			_ = l.server.Close()
		}
		delete(p.conns, l)
		n++
	}
	p.cond.Broadcast()
	return n
}

// SetTarget makes new connections go to target (host:port): a failover to another server.
// Open connections keep their upstream; Reset them to move every client.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Conns returns the number of open proxied connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops accepting, closes every connection and waits for the forwarders.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for l := range p.conns {
		_ = l.client.Close()
		if l.server != nil {
			_ = l.server.Close()
		}
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		l := &link{client: c}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.connect(l)
	}
}

// connect waits while blackholed, dials the target and starts both forwarders.
func (p *Proxy) connect(l *link) {
	defer p.wg.Done()
	if !p.waitPass(l) {
		return
	}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	s, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		p.drop(l)
		return
	}
	p.mu.Lock()
	if _, ok := p.conns[l]; !ok || p.closed {
		p.mu.Unlock()
		_ = s.Close()
		_ = l.client.Close()
		return
	}
	l.server = s
	p.mu.Unlock()
	p.wg.Add(2)
	go p.pipe(l, l.client, s)
	go p.pipe(l, s, l.client)
}

// waitPass blocks while the proxy is blackholed; it returns false when l was dropped or
// the proxy closed meanwhile.
func (p *Proxy) waitPass(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if _, ok := p.conns[l]; !ok || p.closed {
			return false
		}
		if p.mode == Pass {
			return true
		}
		p.cond.Wait()
	}
}

func (p *Proxy) drop(l *link) {
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
	_ = l.client.Close()
	if l.server != nil {
		_ = l.server.Close()
	}
}

// pipe copies src to dst chunk by chunk, holding chunks while blackholed and applying the
// latency and bandwidth in force when each chunk arrives.
func (p *Proxy) pipe(l *link, src, dst net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitPass(l) {
				return
			}
			p.mu.Lock()
			lat, bw := p.latency, p.bandwidth
			p.mu.Unlock()
			if bw > 0 {
				lat += time.Duration(n) * time.Second / time.Duration(bw)
			}
			if lat > 0 {
				time.Sleep(lat)
			}
			if !p.waitPass(l) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				p.drop(l)
				return
			}
		}
		if err != nil { // EOF, a reset, or the link was closed here
			p.halfDone(l, src)
			return
		}
	}
}

// halfDone handles the end of one direction: while passing, the whole link is closed (as
// a real peer's FIN or reset would end the session); while partitioned the client side is
// kept open and silent.
func (p *Proxy) halfDone(l *link, src net.Conn) {
	p.mu.Lock()
	partitioned := p.mode == Blackhole && src == l.server
	_, live := p.conns[l]
	p.mu.Unlock()
	if partitioned && live {
		return
	}
	p.drop(l)
}

func isClosed(c net.Conn) bool {
	// A closed net.Conn fails SetDeadline with net.ErrClosed.
	return errors.Is(c.SetReadDeadline(time.Time{}), net.ErrClosed)
}
