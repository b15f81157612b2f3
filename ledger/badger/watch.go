package badger

import (
	"context"
	"sync"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
)

// watchBuffer is how many changes a watcher may fall behind before it misses some.
const watchBuffer = 256

// Watch implements ledger.Watcher in-process: it delivers every durable write this Ledger
// makes to residuals of namespace (every namespace when empty), in the order the writes
// were acknowledged for any one goroutine. A reader more than watchBuffer changes behind
// misses changes (writers never block) and should re-list. The channel is closed when ctx
// ends or the ledger is closed; Watch on a closed ledger returns lease.ErrClosed. Writes
// by other processes are not seen (only one process can open the store anyway).
func (l *Ledger) Watch(ctx context.Context, namespace string) (<-chan ledger.Change, error) {
	release, err := l.enter()
	if err != nil {
		return nil, err
	}
	defer release()
	return l.hub.watch(ctx, namespace)
}

// hub fans changes out to watchers.
type hub struct {
	mu      sync.Mutex
	subs    map[*watcher]struct{}
	closed  bool
	done    chan struct{} // closed by close: every watcher goroutine ends
	wg      sync.WaitGroup
	dropped uint64 // changes not delivered to slow readers, for tests
}

type watcher struct {
	namespace string
	ch        chan ledger.Change
}

func newHub() *hub {
	return &hub{subs: map[*watcher]struct{}{}, done: make(chan struct{})}
}

func (h *hub) watch(ctx context.Context, namespace string) (<-chan ledger.Change, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, lease.ErrClosed
	}
	w := &watcher{namespace: namespace, ch: make(chan ledger.Change, watchBuffer)}
	h.subs[w] = struct{}{}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		select {
		case <-ctx.Done():
		case <-h.done:
		}
		h.mu.Lock()
		delete(h.subs, w)
		close(w.ch)
		h.mu.Unlock()
	}()
	return w.ch, nil
}

// publish offers c to every matching watcher without blocking.
func (h *hub) publish(c ledger.Change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.subs {
		if w.namespace != "" && w.namespace != c.Namespace {
			continue
		}
		select {
		case w.ch <- c:
		default:
			h.dropped++
		}
	}
}

// close ends every watcher and waits for their goroutines.
func (h *hub) close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	close(h.done)
	h.mu.Unlock()
	h.wg.Wait()
}
