package mcpserver

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// space is one namespace: its interceptor, its MCP server (tools, resources, prompt), its
// HTTP transport and the sessions subscribed to its resources.
type space struct {
	srv *Server
	ns  string
	ic  *interceptor.Interceptor
	mcp *server.MCPServer

	httpOnce sync.Once
	http     *server.StreamableHTTPServer

	subs subscriptions

	// open is the set of open residual keys listed as resources; only the watcher writes it.
	openMu sync.Mutex
	open   map[string]bool
}

const instructions = `toolfence keeps a ledger of side-effecting tool calls so that they happen at most once.
Guard a call: begin_call(task, operation, target, args) → proceed (perform the call, then commit_call
with the key, token and lease_secret and what upstream answered; keep lease_secret to yourself),
replay (use the cached result, do not call), or blocked (do not call; follow the recovery).
A successor agent starts with list_pending or the reconcile_task prompt, settles unknown and
accepted residuals with reconcile or resolve_residual, and never repeats a call whose outcome
is unknown.`

func newSpace(s *Server, ns string, ic *interceptor.Interceptor) *space {
	sp := &space{srv: s, ns: ns, ic: ic, open: map[string]bool{}}
	hooks := &server.Hooks{}
	sp.subs.install(hooks)
	sp.mcp = server.NewMCPServer("toolfence", s.opts.Version,
		server.WithToolCapabilities(false),
		server.WithResourceCapabilities(true, true),
		server.WithPromptCapabilities(false),
		server.WithHooks(hooks),
		sp.withTracing(hooks),
		server.WithPaginationLimit(s.opts.PageSize),
		server.WithToolHandlerMiddleware(sp.recoverTool),
		server.WithResourceRecovery(),
		server.WithInstructions(instructions),
		server.WithDescription("Leases and residuals of side-effecting tool calls, for successor agents and any MCP agent"),
	)
	sp.addTools()
	sp.addResources()
	sp.addPrompt()
	return sp
}

// httpHandler returns the namespace's streamable HTTP transport, creating it on first use.
func (sp *space) httpHandler() *server.StreamableHTTPServer {
	sp.httpOnce.Do(func() {
		opts := []server.StreamableHTTPOption{
			server.WithStreamableHTTPLogger(sp.srv.opts.Logger),
			server.WithHeartbeatInterval(30 * time.Second),
		}
		if sp.srv.opts.HTTPStateless {
			opts = append(opts, server.WithStateLess(true))
		} else {
			opts = append(opts, server.WithSessionIdManagerResolver(sp))
		}
		sp.http = server.NewStreamableHTTPServer(sp.mcp, opts...)
	})
	return sp.http
}

// recoverTool turns a panic in a tool handler into an isError result, so the agent learns
// that the call failed inside the server (and nothing about its outcome was decided here).
func (sp *space) recoverTool(next server.ToolHandlerFunc) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (res *mcp.CallToolResult, err error) {
		defer func() {
			if p := recover(); p != nil {
				sp.srv.opts.Logger.Error("mcpserver: tool panicked", "tool", req.Params.Name, "panic", p, "stack", string(debug.Stack()))
				res, err = toolError(req.Params.Name, mcpwire.KindInternal, fmt.Sprintf("internal error (panic): %v", p),
					"this is a toolfence bug; inspect_residual shows what the ledger recorded before you retry"), nil
			}
		}()
		return next(ctx, req)
	}
}

// watch feeds resource notifications from the ledger's change stream until ctx ends.
func (sp *space) watch(ctx context.Context, w ledger.Watcher) {
	log := sp.srv.opts.Logger
	for ctx.Err() == nil {
		ch, err := w.Watch(ctx, sp.ns)
		if err != nil {
			if ctx.Err() != nil {
				return // shutting down: not a failure
			}
			log.Error("mcpserver: watch failed", "namespace", sp.ns, "err", err)
			select {
			case <-ctx.Done():
				return
			// The retry waits on the injected clock like the resync below, so tests
			// drive it with lease.Fake instead of sleeping.
			case <-sp.clock().After(watchRetry):
				continue
			}
		}
		// (Re)build the open set after subscribing, so no change falls in between; rebuild
		// it now and then, since a slow reader may miss changes.
		sp.syncOpen(ctx)
		resync := sp.clock().After(resyncEvery)
	stream:
		for {
			select {
			case c, ok := <-ch:
				if !ok {
					break stream
				}
				sp.changed(c)
			case <-ctx.Done():
				return
			case <-resync:
				sp.syncOpen(ctx)
				resync = sp.clock().After(resyncEvery)
			}
		}
	}
}

// resyncEvery is how often the watcher rebuilds the resource list from the ledger;
// watchRetry is how long it waits after a failed subscription.
const (
	resyncEvery = time.Minute
	watchRetry  = time.Second
)

// syncOpen lists the open residuals and makes the resource list match.
func (sp *space) syncOpen(ctx context.Context) {
	open := map[string]bool{}
	cursor := ""
	for {
		page, err := sp.ic.Ledger().List(ctx, ledger.ListParams{
			Namespace: sp.ns, States: openStates, Limit: ledger.MaxListLimit, Cursor: cursor,
		})
		if err != nil {
			if ctx.Err() == nil {
				sp.srv.opts.Logger.Error("mcpserver: listing open residuals failed", "namespace", sp.ns, "err", err)
			}
			return
		}
		for _, r := range page.Residuals {
			open[r.Key] = true
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	sp.openMu.Lock()
	defer sp.openMu.Unlock()
	var add []server.ServerResource
	var del []string
	for k := range open {
		if !sp.open[k] {
			add = append(add, sp.residualResource(k))
		}
	}
	for k := range sp.open {
		if !open[k] {
			del = append(del, residualURI(k))
		}
	}
	sp.open = open
	if len(add) > 0 {
		sp.mcp.AddResources(add...)
	}
	if len(del) > 0 {
		sp.mcp.DeleteResources(del...)
	}
}

// changed handles one ledger change: resources/updated to the sessions subscribed to the
// residual or to the pending list, and list_changed when the set of open residuals changed.
func (sp *space) changed(c ledger.Change) {
	if c.Namespace != "" && c.Namespace != sp.ns {
		return
	}
	sp.subs.notifyUpdated(residualURI(c.Key))
	sp.subs.notifyUpdated(PendingURI)
	open := c.State.Open()
	sp.openMu.Lock()
	defer sp.openMu.Unlock()
	switch {
	case open && !sp.open[c.Key]:
		sp.open[c.Key] = true
		sp.mcp.AddResources(sp.residualResource(c.Key)) // broadcasts list_changed
	case !open && sp.open[c.Key]:
		delete(sp.open, c.Key)
		sp.mcp.DeleteResources(residualURI(c.Key)) // broadcasts list_changed
	}
}

// openStates are the states list_pending shows by default.
var openStates = []residual.State{residual.Pending, residual.Unknown, residual.Accepted}

// subscriptions tracks which sessions asked for notifications/resources/updated of which
// URIs: through resources/subscribe (protocol versions up to 2025-11-25) or through the
// resource filter of subscriptions/listen (2026-07-28).
type subscriptions struct {
	mu sync.Mutex
	by map[server.ClientSession]map[string]bool
}

func (s *subscriptions) install(h *server.Hooks) {
	h.AddAfterSubscribe(func(ctx context.Context, _ any, m *mcp.SubscribeRequest, _ *mcp.EmptyResult) {
		s.add(server.ClientSessionFromContext(ctx), m.Params.URI)
	})
	h.AddAfterUnsubscribe(func(ctx context.Context, _ any, m *mcp.UnsubscribeRequest, _ *mcp.EmptyResult) {
		s.remove(server.ClientSessionFromContext(ctx), m.Params.URI)
	})
	h.AddBeforeSubscriptionsListen(func(ctx context.Context, _ any, m *mcp.SubscriptionsListenRequest) {
		for _, uri := range m.Params.Notifications.ResourceSubscriptions {
			s.add(server.ClientSessionFromContext(ctx), uri)
		}
	})
	h.AddAfterSubscriptionsListen(func(ctx context.Context, _ any, _ *mcp.SubscriptionsListenRequest, _ *mcp.SubscriptionsListenResult) {
		s.drop(server.ClientSessionFromContext(ctx))
	})
	h.AddOnError(func(ctx context.Context, _ any, method mcp.MCPMethod, _ any, _ error) {
		if method == mcp.MethodSubscriptionsListen {
			s.drop(server.ClientSessionFromContext(ctx))
		}
	})
	h.AddOnUnregisterSession(func(_ context.Context, sess server.ClientSession) { s.drop(sess) })
}

func (s *subscriptions) add(sess server.ClientSession, uri string) {
	if sess == nil || uri == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[server.ClientSession]map[string]bool{}
	}
	if s.by[sess] == nil {
		s.by[sess] = map[string]bool{}
	}
	s.by[sess][uri] = true
}

func (s *subscriptions) remove(sess server.ClientSession, uri string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.by[sess], uri)
}

func (s *subscriptions) drop(sess server.ClientSession) {
	if sess == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.by, sess)
}

// notifyUpdated sends notifications/resources/updated for uri to every subscribed session,
// without blocking: a session whose queue is full misses it (clients re-read on the next).
func (s *subscriptions) notifyUpdated(uri string) {
	s.mu.Lock()
	var to []server.ClientSession
	for sess, uris := range s.by {
		if uris[uri] {
			to = append(to, sess)
		}
	}
	s.mu.Unlock()
	n := mcp.JSONRPCNotification{
		JSONRPC: mcp.JSONRPC_VERSION,
		Notification: mcp.Notification{
			Method: mcp.MethodNotificationResourceUpdated,
			Params: mcp.NotificationParams{AdditionalFields: map[string]any{"uri": uri}},
		},
	}
	for _, sess := range to {
		if up, ok := sess.(server.SessionWithStreamableHTTPConfig); ok {
			up.UpgradeToSSEWhenReceiveNotification()
		}
		select {
		case sess.NotificationChannel() <- n:
		default:
		}
	}
}

// clock is the clock of the namespace's interceptor.
func (sp *space) clock() lease.Clock { return sp.ic.Settings().Clock }

// now reads the namespace's clock.
func (sp *space) now() time.Time { return sp.clock().Now() }
