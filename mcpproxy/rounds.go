package mcpproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/residual"
)

// DefaultRoundTimeout is how long a protected call that upstream answered input_required
// waits for the host to continue it (Options.RoundTimeout).
const DefaultRoundTimeout = 10 * time.Minute

// A multi-round-trip call (MCP 2026-07-28, SEP-2322) is one logical call: upstream answers a
// tools/call with resultType "input_required" and inputRequests, and the host continues it
// by sending the same call again with inputResponses and requestState. The proxy keeps such a
// protected call's attempt open between rounds: its residual stays pending under its lease,
// renewed all along, and nothing is recorded until upstream's final answer (complete, task or
// error), which is classified and recorded like any other. A continuation is recognised by its
// key: the host's next tools/call with the same key while the round is open is dispatched
// under the same attempt and fencing token, never begun again, never replayed.
//
// Decisions (docs/proxy.md "Protocol revisions"):
//   - An input_required answer is never a terminal outcome, and is not recorded.
//   - A continuation must repeat the arguments of the call it continues: one whose arguments
//     differ is refused (nothing sent) and the round stays open.
//   - A round the host does not continue within RoundTimeout is abandoned and recorded
//     failed: upstream said it could not finish without input, and an MCP server keeps
//     nothing between rounds (SEP-2322), so the call had no effect; a later call begins
//     anew. The same holds when the host's session ends (a stdio host, an HTTP session) or
//     the proxy shuts down: the host can no longer continue.
//   - A proxy that dies between rounds records nothing: the lease expires and the key is
//     unknown, so a successor never dispatches the call a second time (a person settles it).
//   - Rounds live in the proxy process: a continuation must reach the proxy that answered
//     the round (behind a load balancer, route a host's requests to one proxy).

// round is one protected call waiting for the host's next round.
type round struct {
	key, ns, tool string
	a             *interceptor.Attempt
	keep          *lease.Session // renews a's lease until the call is over
	digest        string         // request digest of the call's arguments
	owner         *session       // the stateful session whose end abandons it; nil: stateless
	done          chan struct{}  // closed once the round is over (concluded or abandoned)

	// Under rounds.mu:
	busy     bool      // a dispatch is in flight
	n        int       // input_required answers so far
	state    string    // requestState of upstream's last round ("" when it gave none)
	deadline time.Time // abandoned when not continued by then
	touch    chan struct{}
}

// rounds holds the open rounds of a proxy, by key (keys differ between namespaces) and by
// the namespace and requestState of upstream's last round.
type rounds struct {
	mu      sync.Mutex
	byKey   map[string]*round
	byState map[string]*round
}

// roundFor returns the open round that a call of key with arguments of digest digest,
// echoing requestState state, continues, marked busy; or (nil, refusal text) when it
// continues a round that cannot take it (busy, or other arguments: a call echoing the
// requestState of another key's round, or of key's own with another digest); or (nil, "")
// when it continues none that is alive.
func (rs *rounds) roundFor(ns, key, digest, state string) (*round, string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rd := rs.byKey[key]
	if other := rs.byState[stateKey(ns, state)]; state != "" && other != nil && other != rd {
		rd = other
	}
	switch {
	case rd == nil:
		return nil, ""
	case rd.keep.Err() != nil:
		// The lease could not be renewed: the attempt will expire into unknown; Begin says so.
		rs.removeLocked(rd)
		return nil, ""
	case rd.busy:
		return nil, "refused: the previous round of this call is still being sent upstream; nothing was sent. Wait for its answer, then continue with it"
	case rd.key != key || rd.digest != digest:
		return nil, "refused: this continues a multi-round call (upstream asked for input) with other arguments; nothing was sent. " +
			"Continue it with the arguments it began with, or let it lapse and make a new call"
	case bridged(rd.state) && state != rd.state:
		// A 2025-11-25 upstream behind the bridge is still running the call, waiting for the
		// host's input: the same call again would run it a second time.
		return nil, "refused: this call is in progress upstream, waiting for the host's answer to its round (upstream asked for input); nothing was sent. " +
			"Continue that round with its requestState, or let it lapse"
	}
	rd.busy = true
	return rd, ""
}

// stateKey indexes a round by the requestState of upstream's last round (in ns).
func stateKey(ns, state string) string { return ns + "\x00" + state }

// open records a round for attempt a in namespace ns, busy until again says it waits.
func (rs *rounds) open(p *Proxy, owner *session, key, tool, digest string, a *interceptor.Attempt, keep *lease.Session) *round {
	rd := &round{key: key, ns: p.ic.Namespace(), tool: tool, a: a, keep: keep, digest: digest, owner: owner,
		done: make(chan struct{}), touch: make(chan struct{}, 1), busy: true}
	rs.mu.Lock()
	if rs.byKey == nil {
		rs.byKey, rs.byState = map[string]*round{}, map[string]*round{}
	}
	if old := rs.byKey[key]; old != nil { // cannot be open: Begin acquired the key
		rs.removeLocked(old)
	}
	rs.byKey[key] = rd
	rs.mu.Unlock()
	go p.watchRound(rd)
	return rd
}

// again marks rd waiting for the host after upstream's input_required answer whose
// requestState is state, until RoundTimeout from now.
func (rs *rounds) again(p *Proxy, rd *round, state string) {
	rs.mu.Lock()
	rd.busy = false
	rd.n++
	rd.deadline = p.clock().Now().Add(p.cfg.RoundTimeout)
	if rd.state != "" && rs.byState[stateKey(rd.ns, rd.state)] == rd {
		delete(rs.byState, stateKey(rd.ns, rd.state))
	}
	if rd.state = state; state != "" {
		rs.byState[stateKey(rd.ns, state)] = rd
	}
	rs.mu.Unlock()
	rd.poke()
}

// release marks rd waiting again after a continuation that was refused before it was sent.
func (rs *rounds) release(rd *round) {
	rs.mu.Lock()
	rd.busy = false
	rs.mu.Unlock()
	rd.poke()
}

// poke wakes rd's watcher (watchRound) to read its deadline again.
func (rd *round) poke() {
	select {
	case rd.touch <- struct{}{}:
	default:
	}
}

// end removes rd once its call is over (its final answer is being recorded).
func (rs *rounds) end(rd *round) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.byKey[rd.key] == rd {
		rs.removeLocked(rd)
	}
}

// removeLocked forgets rd and marks it over, under rs.mu.
func (rs *rounds) removeLocked(rd *round) {
	delete(rs.byKey, rd.key)
	if rd.state != "" && rs.byState[stateKey(rd.ns, rd.state)] == rd {
		delete(rs.byState, stateKey(rd.ns, rd.state))
	}
	close(rd.done)
}

// claim removes rd for abandoning it, unless a continuation is in flight or it is over.
func (rs *rounds) claim(rd *round, now time.Time, force bool) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.byKey[rd.key] != rd || rd.busy || (!force && now.Before(rd.deadline)) {
		return false
	}
	rs.removeLocked(rd)
	return true
}

// owned returns the open rounds of owner (every open round for nil).
func (rs *rounds) owned(owner *session) []*round {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []*round
	for _, rd := range rs.byKey {
		if owner == nil || rd.owner == owner {
			out = append(out, rd)
		}
	}
	return out
}

// watchRound abandons rd once its deadline passes without a continuation.
func (p *Proxy) watchRound(rd *round) {
	clock := p.clock()
	for {
		p.rounds.mu.Lock()
		wait, busy := rd.deadline.Sub(clock.Now()), rd.busy
		p.rounds.mu.Unlock()
		var deadline <-chan time.Time // none while a continuation is in flight: again or release touch rd
		if !busy {
			deadline = clock.After(max(wait, 0))
		}
		select {
		case <-rd.done:
			return
		case <-rd.touch:
			continue
		case <-deadline:
		}
		if p.rounds.claim(rd, clock.Now(), false) {
			p.abandon(rd, fmt.Sprintf("the host did not continue it within %v", p.cfg.RoundTimeout))
			return
		}
	}
}

// abandonRounds abandons the open rounds of owner (every one for nil): the host can no
// longer continue them. A round whose continuation is in flight is left to it.
func (p *Proxy) abandonRounds(owner *session, why string) {
	for _, rd := range p.rounds.owned(owner) {
		if p.rounds.claim(rd, time.Time{}, true) {
			p.abandon(rd, why)
		}
	}
}

// bridged reports whether a round's requestState is the bridge's own (legacyUp): its call is
// still running in a 2025-11-25 upstream, waiting for the host's input.
func bridged(state string) bool { return strings.HasPrefix(state, bridgeState) }

// abandon records rd's call failed: upstream answered input_required and the host never
// continued, so upstream did not finish it. A bridged round's call is recorded unknown: the
// 2025-11-25 upstream is still running it and may act without the host's input.
func (p *Proxy) abandon(rd *round, why string) {
	rd.keep.Close()
	rep := interceptor.Report{Outcome: residual.Failed, Error: fmt.Sprintf("abandoned multi-round call: upstream answered input_required %d time(s) and %s; an input_required answer means upstream has not finished the call, so it had no effect", rd.n, why)}
	if bridged(rd.state) {
		rep = interceptor.Report{Outcome: residual.Unknown, Error: fmt.Sprintf("abandoned multi-round call: the upstream (MCP 2025-11-25, bridged) asked for the host's input %d time(s) and %s; it was still running the call, so whether it acted is not known", rd.n, why)}
	}
	if res, err := rd.a.Report(context.Background(), rep); res == nil { // recorded: a Result, whatever its error
		p.log.Warn("toolfence proxy: could not record an abandoned multi-round call; its lease expires and the key becomes unknown",
			"key", rd.key, "tool", rd.tool, "err", err)
		return
	}
	p.log.Info("toolfence proxy: multi-round call abandoned", "key", rd.key, "tool", rd.tool, "outcome", rep.Outcome, "why", why)
}

// inputRequired reports whether resp is an input_required answer of a tools/call (SEP-2322):
// a result whose resultType says so. A malformed one is not: classify leaves it unknown.
func inputRequired(resp *jsonrpc.Response) bool {
	if resp == nil || resp.Error != nil {
		return false
	}
	var r struct {
		ResultType    string          `json:"resultType"`
		InputRequests json.RawMessage `json:"inputRequests"`
	}
	if json.Unmarshal(resp.Result, &r) != nil || r.ResultType != resultInputRequired {
		return false
	}
	// The load-shedding form may carry an empty map; absent or an object it must be.
	var obj map[string]json.RawMessage
	return len(r.InputRequests) == 0 || string(r.InputRequests) == "null" || json.Unmarshal(r.InputRequests, &obj) == nil
}

// requestState is the requestState of an input_required answer ("" when it has none).
func requestState(resp *jsonrpc.Response) string {
	var r struct {
		RequestState string `json:"requestState"`
	}
	_ = json.Unmarshal(resp.Result, &r)
	return r.RequestState
}

// The resultType values of SEP-2322 and the tasks extension.
const (
	resultComplete      = "complete"
	resultInputRequired = "input_required"
	resultTask          = "task"
)
