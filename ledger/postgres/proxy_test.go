package postgres_test

import (
	"bytes"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// faultProxy forwards TCP connections on loopback to the test server and can lose a reply:
// once armed with a pattern, the first client message containing it is forwarded to the
// server, and the server's reply to it is dropped and the connection cut, so the server
// has executed (and committed) what the client never hears about.
type faultProxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu      sync.Mutex
	pattern []byte
	conns   map[net.Conn]struct{}
	refuse  bool // cut new connections at once: the server looks unreachable
	// onCut, when set, runs once a lost reply has been dropped and before the client's
	// connection is cut: what it does happens between the lost write and its retry.
	onCut func()

	cuts atomic.Int32
	wg   sync.WaitGroup
}

// newFaultProxy starts a proxy to the test server; it stops when the test ends.
func newFaultProxy(t testing.TB) *faultProxy {
	t.Helper()
	cfg, err := pgx.ParseConfig(testDSN())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &faultProxy{t: t, ln: ln, target: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// dsn returns the test DSN pointed at the proxy, with extra query parameters.
func (p *faultProxy) dsn(params url.Values) string {
	p.t.Helper()
	u, err := url.Parse(testDSN())
	require.NoError(p.t, err, "the fault tests need TOOLFENCE_TEST_PG as a postgres:// URL")
	u.Host = p.ln.Addr().String()
	q := u.Query()
	for k, v := range params {
		q[k] = v
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// loseReplyTo arms the proxy: the reply to the next client message containing pattern is
// lost and its connection cut.
func (p *faultProxy) loseReplyTo(pattern string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pattern = []byte(pattern)
}

// setRefuse makes new connections fail (true) or pass (false).
func (p *faultProxy) setRefuse(v bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = v
}

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refuse
		p.mu.Unlock()
		if refuse {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		var armed atomic.Bool
		p.wg.Add(2)
		go p.pipe(c, s, func(b []byte) bool { // client → server
			p.mu.Lock()
			defer p.mu.Unlock()
			if len(p.pattern) > 0 && bytes.Contains(b, p.pattern) {
				p.pattern = nil
				armed.Store(true)
			}
			return true
		})
		go p.pipe(s, c, func([]byte) bool { // server → client
			if armed.Load() {
				p.cuts.Add(1)
				p.mu.Lock()
				hook := p.onCut
				p.onCut = nil
				p.mu.Unlock()
				if hook != nil {
					hook()
				}
				return false
			}
			return true
		})
	}
}

// pipe copies from src to dst while pass allows each chunk; it closes both ends when
// either side ends or pass refuses a chunk.
func (p *faultProxy) pipe(src, dst net.Conn, pass func([]byte) bool) {
	defer p.wg.Done()
	defer func() {
		src.Close()
		dst.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !pass(buf[:n]) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF, or the other direction closed this connection
		}
	}
}

func (p *faultProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
