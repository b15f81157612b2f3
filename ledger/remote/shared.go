package remote

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// SharedOptions configure OpenShared.
type SharedOptions struct {
	// Socket is the path of the unix socket the owner serves the store on and the other
	// processes dial. Required; keep it inside the store's directory.
	Socket string
	// Open opens the store in this process. Required. While another process holds the
	// store it must fail with an error for which Locked reports true.
	Open func() (ledger.Ledger, error)
	// Locked reports whether an error of Open means another process holds the store.
	// Required.
	Locked func(error) bool
	// Wait bounds how long a call waits for an owner that answers (the store is held, but
	// its socket does not answer yet: an owner starting or going away) before it fails
	// with an error wrapping ledger.ErrUnavailable and Open's error. Defaults to 10 seconds.
	Wait time.Duration
	// Client configures the connection to the owner's socket (Token and Transport are
	// ignored: a guest dials the socket itself, after checking it is this user's).
	Client Options
	// Logger receives one line each time this process becomes the owner, and when it
	// cannot serve its socket. Defaults to discarding.
	Logger *slog.Logger
}

// DefaultWait is the default of SharedOptions.Wait.
const DefaultWait = 10 * time.Second

// Shared is a ledger.Ledger over a store that one process at a time may open (an embedded
// badger directory). The first process to open it is its owner: it uses the store itself
// and serves it to the others on a unix socket (Handler, every namespace; the socket has
// mode 0600 and is bound inside a private directory before it is moved into place, so only
// the store's user can ever connect). The others are guests: their calls go to the owner
// over the socket, once they checked that the socket file is theirs (owner, not writable by
// group or others) and, on Linux, that the process serving it runs as them (SO_PEERCRED);
// a socket that fails a check gets an error wrapping ErrUntrustedSocket, and nothing is
// sent to it.
//
// When the owner goes away (it exits, or is killed), a guest's next call opens the store
// itself and becomes the new owner, or, when another guest was faster, dials the new
// owner's socket; the call then runs there. A call that never reached the old owner is
// repeated on the new one; a mutating call whose answer was lost returns an error
// wrapping ledger.ErrOutcomeUnknown (it may have happened), and a read is repeated.
// Nothing recorded is lost: every step the old owner answered was durable in the store.
//
// Shared is safe for concurrent use. It implements ledger.Watcher (a stream ends when its
// owner goes away: watch again), ledger.OpenCounter and ledger.Describer.
type Shared struct {
	opts SharedOptions
	mu   sync.Mutex
	// cur is the ledger in use (local as owner, a *Client as guest); nil until the first
	// call and after an owner went away.
	cur    *link
	closed bool
}

// link is one way to the store: the store itself (owner) or the owner's socket (guest).
type link struct {
	l     ledger.Ledger
	owner bool
	// guest only: the transport that dials the owner, closed with the link.
	tr *http.Transport
	// owner only: the server of the socket, its base context's cancel and its end.
	srv    *http.Server
	cancel context.CancelFunc
	served chan struct{}
}

var (
	_ ledger.Ledger      = (*Shared)(nil)
	_ ledger.Watcher     = (*Shared)(nil)
	_ ledger.OpenCounter = (*Shared)(nil)
	_ ledger.Describer   = (*Shared)(nil)
)

// OpenShared opens the store: as its owner when this process can open it, else as a guest
// of the process that holds it. It returns Open's error when that error is not Locked,
// and an error wrapping ledger.ErrUnavailable when the store stays held without an owner that
// answers on the socket for SharedOptions.Wait.
func OpenShared(ctx context.Context, opts SharedOptions) (*Shared, error) {
	switch {
	case opts.Socket == "":
		return nil, errors.New("remote: OpenShared: Socket is required")
	case opts.Open == nil || opts.Locked == nil:
		return nil, errors.New("remote: OpenShared: Open and Locked are required")
	}
	opts.Wait = cmp.Or(opts.Wait, DefaultWait)
	opts.Client.Token = ""
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Shared{opts: opts}
	// Reach the store once now, so that a store that cannot be opened fails here.
	if err := s.do(ctx, false, func(l ledger.Ledger) error {
		if _, ok := l.(*Client); ok {
			_, err := l.Get(ctx, ledger.GetParams{Namespace: "toolfence-probe", Key: probeKey})
			if errors.Is(err, residual.ErrNotFound) {
				return nil
			}
			return err
		}
		return nil
	}); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// probeKey is a well-formed key no call derives (it is not a SHA-256 of anything we hash).
var probeKey = residual.Key("toolfence-probe", "probe", "probe", "probe")

// Owner reports whether this process currently holds the store (false as a guest, or
// before the first call).
func (s *Shared) Owner() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur != nil && s.cur.owner
}

// Local returns the store itself while this process owns it, and nil otherwise.
func (s *Shared) Local() ledger.Ledger {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil && s.cur.owner {
		return s.cur.l
	}
	return nil
}

// get returns the link in use, establishing one when there is none: the store itself when
// Open succeeds, else the owner's socket. lastErr is Open's last Locked error.
func (s *Shared) get() (*link, error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("%w: shared store (socket %s)", lease.ErrClosed, s.opts.Socket), nil
	}
	if s.cur != nil {
		return s.cur, nil, nil
	}
	l, err := s.opts.Open()
	if err == nil {
		s.cur = s.own(l)
		return s.cur, nil, nil
	}
	if !s.opts.Locked(err) {
		return nil, err, nil
	}
	co := s.opts.Client
	tr := ownerTransport(s.opts.Socket)
	co.Transport = tr
	c, cerr := New("unix:"+s.opts.Socket, co)
	if cerr != nil {
		return nil, cerr, nil
	}
	s.cur = &link{l: c, tr: tr}
	return s.cur, nil, err
}

// stale reports whether lk is no longer the link in use (and the Shared is open).
func (s *Shared) stale(lk *link) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.closed && s.cur != lk
}

// drop forgets lk after its owner went away.
func (s *Shared) drop(lk *link) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == lk {
		s.cur = nil
		_ = s.closeLink(lk)
	}
}

// do runs fn on the store, moving to a new owner when the current one is gone: a request
// that never reached it is repeated, a read whose answer was lost too; a mutating step
// whose answer was lost returns its error (ErrOutcomeUnknown).
func (s *Shared) do(ctx context.Context, mutating bool, fn func(ledger.Ledger) error) error {
	var deadline time.Time
	backoff := 10 * time.Millisecond
	for {
		lk, err, locked := s.get()
		if err != nil {
			return err
		}
		err = fn(lk.l)
		if !lk.owner && errors.Is(err, lease.ErrClosed) && s.stale(lk) {
			continue // another call dropped this link before the request left: not sent
		}
		if err == nil || lk.owner || ctx.Err() != nil {
			return err
		}
		if ue := (*untrustedError)(nil); errors.As(err, &ue) {
			s.drop(lk) // the next call checks the socket again
			return ue
		}
		if !IsUnavailable(err) {
			return err
		}
		s.drop(lk)
		if mutating && errors.Is(err, ErrConnectionLost) {
			return err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(s.opts.Wait)
		} else if time.Now().After(deadline) {
			if locked != nil {
				return fmt.Errorf("remote: %w: %w: the store is held by another process, which did not answer on %s within %v: %v",
					ledger.ErrUnavailable, locked, s.opts.Socket, s.opts.Wait, err)
			}
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", context.Cause(ctx), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// own makes this process the owner of l: it serves l on the socket. When the socket cannot
// be served, the process still uses the store (others then wait and fail).
func (s *Shared) own(l ledger.Ledger) *link {
	lk := &link{l: l, owner: true}
	ln, err := listenPrivate(s.opts.Socket)
	if err != nil {
		s.opts.Logger.Warn("remote: this process holds the store but cannot serve it to others", "socket", s.opts.Socket, "err", err)
		return lk
	}
	base, cancel := context.WithCancel(context.Background())
	mux := http.NewServeMux()
	mux.Handle(Path, Handler(l, HandlerOptions{Authorize: AllNamespaces()}))
	lk.srv = &http.Server{
		Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return base },
	}
	lk.cancel, lk.served = cancel, make(chan struct{})
	go func() {
		defer close(lk.served)
		_ = lk.srv.Serve(ln)
	}()
	s.opts.Logger.Info("remote: this process owns the store and serves it to other processes", "socket", s.opts.Socket)
	return lk
}

// close ends a link: an owner stops serving (answering the requests in flight, for up to
// five seconds), removes its socket and closes the store.
func (s *Shared) closeLink(lk *link) error {
	if lk.srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		lk.cancel() // ends watch streams
		err := lk.srv.Shutdown(sctx)
		cancel()
		if err != nil {
			lk.srv.Close()
		}
		<-lk.served
		_ = os.Remove(s.opts.Socket)
	}
	err := lk.l.Close()
	if lk.tr != nil {
		lk.tr.CloseIdleConnections()
	}
	return err
}

// Close stops serving the socket (as owner) and closes the store or the connection to the
// owner. Calls after Close return errors wrapping lease.ErrClosed.
func (s *Shared) Close() error {
	s.mu.Lock()
	lk := s.cur
	s.cur, s.closed = nil, true
	s.mu.Unlock()
	if lk == nil {
		return nil
	}
	return s.closeLink(lk)
}

// Reserve implements ledger.Ledger on the store or through its owner.
func (s *Shared) Reserve(ctx context.Context, p ledger.ReserveParams) (out *ledger.ReserveResult, err error) {
	err = s.do(ctx, true, func(l ledger.Ledger) (err error) { out, err = l.Reserve(ctx, p); return err })
	return out, err
}

// Commit implements ledger.Ledger on the store or through its owner.
func (s *Shared) Commit(ctx context.Context, p ledger.CommitParams) (out *residual.Residual, err error) {
	err = s.do(ctx, true, func(l ledger.Ledger) (err error) { out, err = l.Commit(ctx, p); return err })
	return out, err
}

// Renew implements ledger.Ledger on the store or through its owner.
func (s *Shared) Renew(ctx context.Context, p ledger.RenewParams) (out lease.Lease, err error) {
	err = s.do(ctx, true, func(l ledger.Ledger) (err error) { out, err = l.Renew(ctx, p); return err })
	return out, err
}

// Resolve implements ledger.Ledger on the store or through its owner.
func (s *Shared) Resolve(ctx context.Context, p ledger.ResolveParams) (out *residual.Residual, err error) {
	err = s.do(ctx, true, func(l ledger.Ledger) (err error) { out, err = l.Resolve(ctx, p); return err })
	return out, err
}

// AppendEvidence implements ledger.Ledger on the store or through its owner.
func (s *Shared) AppendEvidence(ctx context.Context, p ledger.EvidenceParams) (out *residual.Residual, err error) {
	err = s.do(ctx, true, func(l ledger.Ledger) (err error) { out, err = l.AppendEvidence(ctx, p); return err })
	return out, err
}

// Get implements ledger.Ledger on the store or through its owner.
func (s *Shared) Get(ctx context.Context, p ledger.GetParams) (out *residual.Residual, err error) {
	err = s.do(ctx, false, func(l ledger.Ledger) (err error) { out, err = l.Get(ctx, p); return err })
	return out, err
}

// List implements ledger.Ledger on the store or through its owner.
func (s *Shared) List(ctx context.Context, p ledger.ListParams) (out *ledger.Page, err error) {
	err = s.do(ctx, false, func(l ledger.Ledger) (err error) { out, err = l.List(ctx, p); return err })
	return out, err
}

// GC implements ledger.Ledger on the store or through its owner.
func (s *Shared) GC(ctx context.Context, p ledger.GCParams) (out ledger.GCResult, err error) {
	err = s.do(ctx, true, func(l ledger.Ledger) (err error) { out, err = l.GC(ctx, p); return err })
	return out, err
}

// Watch implements ledger.Watcher on the store or through its owner. The channel closes
// when ctx ends, and also when the owner it watches through goes away: watch again (the
// next Watch moves to the new owner) and re-list.
func (s *Shared) Watch(ctx context.Context, namespace string) (out <-chan ledger.Change, err error) {
	err = s.do(ctx, false, func(l ledger.Ledger) (err error) {
		w, ok := l.(ledger.Watcher)
		if !ok {
			return fmt.Errorf("%w: the store does not stream changes", ErrProtocol)
		}
		out, err = w.Watch(ctx, namespace)
		return err
	})
	return out, err
}

// OpenResiduals implements ledger.OpenCounter on the store or through its owner.
func (s *Shared) OpenResiduals(ctx context.Context) (out []ledger.OpenCount, err error) {
	err = s.do(ctx, false, func(l ledger.Ledger) (err error) {
		oc, ok := l.(ledger.OpenCounter)
		if !ok {
			return fmt.Errorf("%w: the store does not count open residuals", ErrProtocol)
		}
		out, err = oc.OpenResiduals(ctx)
		return err
	})
	return out, err
}

// Describe implements ledger.Describer: the store's own description while this process
// owns it, the socket's otherwise.
func (s *Shared) Describe() ledger.Description {
	s.mu.Lock()
	lk := s.cur
	s.mu.Unlock()
	if lk != nil {
		if d, ok := lk.l.(ledger.Describer); ok {
			return d.Describe()
		}
	}
	return ledger.Description{System: "toolfence", Namespace: "unix:" + s.opts.Socket, Remote: true}
}
