package mcpproxy

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
)

// statelessListTTL is how long the tool list fetched for stateless (2026-07-28) HTTP hosts
// is used before it is fetched again: those hosts have no session whose list_changed
// would say it is stale. A tool the list lacks is fetched again at once (toolFor).
const statelessListTTL = 10 * time.Second

// toolList is the upstream's tool list as one kind of host sees it: fetched once (for a
// session, until list_changed; for stateless hosts with the same capabilities, for
// statelessListTTL), with the policy's verdict on it and each tool's x-mcp-header bindings.
type toolList struct {
	ttl time.Duration // 0: until reset

	mu       sync.Mutex
	tools    map[string]policy.ToolInfo // nil until fetched
	bindings map[string][]transport.ParamBinding
	err      error // the policy's verdict on tools (CheckCatalog)
	at       time.Time
	gen      uint64        // counts resets: a fetch stores its list only if none came meanwhile
	fetching chan struct{} // closed when the fetch in progress ends; nil: none
}

// cached returns the list and the policy's verdict when they are fetched and fresh at now;
// nil otherwise.
func (l *toolList) cached(now time.Time) (map[string]policy.ToolInfo, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tools == nil || (l.ttl > 0 && now.Sub(l.at) >= l.ttl) {
		return nil, nil
	}
	return l.tools, l.err
}

// binding returns the x-mcp-header bindings of the named tool (nil: none, or not listed).
func (l *toolList) binding(name string) []transport.ParamBinding {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bindings[name]
}

// reset makes the next use fetch the list again.
func (l *toolList) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tools, l.bindings, l.err = nil, nil, nil
	l.gen++
}

// statelessLists are the tool lists of stateless HTTP hosts, one per set of client
// capabilities (a server may list some tools only to capable clients), at most
// maxStatelessLists.
type statelessLists struct {
	mu    sync.Mutex
	lists map[[32]byte]*toolList
}

const maxStatelessLists = 64

// forCaps returns the list for hosts declaring caps.
func (sl *statelessLists) forCaps(caps json.RawMessage) *toolList {
	k := sha256.Sum256(caps)
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if l, ok := sl.lists[k]; ok {
		return l
	}
	if sl.lists == nil || len(sl.lists) >= maxStatelessLists {
		sl.lists = map[[32]byte]*toolList{} // a host sending ever new capabilities cannot grow it
	}
	l := &toolList{ttl: statelessListTTL}
	sl.lists[k] = l
	return l
}

// resetAll makes every stateless list fetched again.
func (sl *statelessLists) resetAll() {
	sl.mu.Lock()
	lists := make([]*toolList, 0, len(sl.lists))
	for _, l := range sl.lists {
		lists = append(lists, l)
	}
	sl.mu.Unlock()
	for _, l := range lists {
		l.reset()
	}
}

// toolList is the list this session's host sees: the session's own, or for a stateless
// request the list shared by the stateless hosts with its capabilities.
func (s *session) toolList() *toolList {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cat == nil {
		if s.stateless {
			s.cat = s.p.stateless.forCaps(s.hostCaps)
		} else {
			s.cat = &toolList{}
		}
	}
	return s.cat
}

// tools returns the upstream's tool list as this session's host sees it and the policy's
// verdict on it, fetching it when it is not cached (one fetch at a time per list: others
// wait for it).
func (s *session) tools(ctx context.Context) (map[string]policy.ToolInfo, error) {
	l := s.toolList()
	for {
		now := s.p.clock().Now()
		if cat, err := l.cached(now); cat != nil {
			return cat, err
		}
		l.mu.Lock()
		if wait := l.fetching; wait != nil {
			l.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("listing the upstream's tools: %w", context.Cause(ctx))
			}
		}
		done := make(chan struct{})
		l.fetching, l.at = done, now
		gen := l.gen
		l.mu.Unlock()
		cat, bindings, catErr, err := s.fetchTools(ctx)
		l.mu.Lock()
		l.fetching = nil
		if err == nil && l.gen == gen {
			l.tools, l.bindings, l.err = cat, bindings, catErr
		}
		l.mu.Unlock()
		close(done)
		if err != nil {
			return nil, err
		}
		return cat, catErr
	}
}

// toolFor returns the named tool's definition, fetching the list again when the cached one
// of a stateless host lacks it (a tool added upstream since), and the policy's verdict.
func (s *session) toolFor(ctx context.Context, name string) (map[string]policy.ToolInfo, error) {
	cat, err := s.tools(ctx)
	if err != nil || s.toolList().ttl == 0 {
		return cat, err
	}
	if _, ok := cat[name]; ok {
		return cat, err
	}
	s.toolList().reset()
	return s.tools(ctx)
}

// fetchTools lists the upstream's tools (following nextCursor) in this session's upstream
// conversation and judges them: the policy's decision on each (remembering what it
// protects), its check of the list (catErr), warnings for arguments the policy names that a
// tool lacks, and each tool's x-mcp-header bindings. err says why no list was got.
func (s *session) fetchTools(ctx context.Context) (cat map[string]policy.ToolInfo, bindings map[string][]transport.ParamBinding, catErr, err error) {
	cat = map[string]policy.ToolInfo{}
	bindings = map[string][]transport.ParamBinding{}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cursor := ""
	for {
		params := json.RawMessage(`{}`)
		if cursor != "" {
			params, _ = json.Marshal(map[string]string{"cursor": cursor})
		}
		r, err := s.roundTrip(ctx, "tools/list", params)
		if err == nil && r.Error != nil {
			err = r.Error
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("listing the upstream's tools: %w", err)
		}
		var page struct {
			Tools      []json.RawMessage `json:"tools"`
			NextCursor string            `json:"nextCursor"`
		}
		if err := json.Unmarshal(r.Result, &page); err != nil {
			return nil, nil, nil, fmt.Errorf("listing the upstream's tools: %w", err)
		}
		for _, def := range page.Tools {
			t, err := policy.ParseTool(def)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("listing the upstream's tools: %w", err)
			}
			cat[t.Name] = t
			b, err := transport.ParamBindings(t.InputSchema.Properties)
			if err != nil && s.p.once("x-mcp-header/"+t.Name) {
				s.p.log.Warn("toolfence proxy: a tool's x-mcp-header annotations are invalid; its calls get no Mcp-Param headers", "tool", t.Name, "err", err)
			}
			bindings[t.Name] = b
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	for name, t := range cat {
		s.p.decide(name, &t) // remembers the tools it protects
	}
	catErr = s.p.cfg.Policy.CheckCatalog(s.p.cfg.ServerID, cat)
	if catErr != nil && s.p.once("policy/"+catErr.Error()) {
		s.p.log.Error("toolfence proxy: every tools/call is refused until the policy is fixed", "err", catErr)
	}
	for _, name := range s.p.cfg.Policy.Names() {
		if t, ok := cat[name]; ok {
			if miss := t.MissingArguments(s.p.cfg.Policy.Tools[name]); len(miss) > 0 && s.p.once("pointers/"+name) {
				s.p.log.Warn("toolfence proxy: the policy's JSON pointers name arguments the tool's inputSchema lacks; calls without them are refused",
					"tool", name, "pointers", miss)
			}
		}
	}
	return cat, bindings, catErr, nil
}
