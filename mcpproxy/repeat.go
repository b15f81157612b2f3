package mcpproxy

import (
	"fmt"
	"sync"
	"time"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpproxy/policy"
)

// DefaultRepeatWindow is Options.RepeatWindow's default: within it, an identical call after
// the host had the answer is a possible retry (docs/proxy.md "The same call again").
const DefaultRepeatWindow = 10 * time.Minute

// The same call again: a retry or a new intent? A call that names no task (_meta
// toolfence.dev/task) is keyed by its tool and arguments (or the policy's target) in the
// proxy's default task, so a call identical to one that succeeded meets its residual. The
// ledger would replay it; the proxy first judges whether it is a retry of that call (its
// answer may not have reached the host: a timeout, a cancellation, a reconnect, a crash of
// either side) or a new intent that looks the same (a file written again after another
// write, a toggle switched back, the daily report tomorrow), by the tool's policy "repeats"
// (policy.RepeatsWindow by default without target and key):
//
//   - window: an identical call whose earlier answer the host may not have had is a retry:
//     answered from the ledger, nothing sent. Once the host had it (this proxy wrote it to
//     the host's live request), the identical call is a new intent when a call of the same
//     tool began after that answer (A, B, A: the third A is sent), or when the window has
//     passed since the earlier call was recorded; otherwise (soon after, nothing in between:
//     a model repeating itself, a toggle switched back) the call alone cannot tell, so the
//     host's user is asked whether to run it again (elicitation), and without elicitation it
//     is answered from the ledger, saying plainly that nothing was sent, when the identical
//     call was recorded and how to make it a new intent.
//   - replay: always answered from the ledger (the policy's target, or upstream's own key,
//     names the intent).
//   - send: a new intent as soon as the host had the earlier answer.
//
// A new intent is a new attempt on the same key, begun only over the success that was
// judged (interceptor.BeginOptions.Supersede): two proxies judging at once make one attempt,
// and an outcome that may have happened (pending, unknown, accepted) still blocks whatever
// the rule says. What the proxy saw (which answers reached hosts, which calls began) is kept
// in memory: after a restart every earlier answer counts as not delivered (answered from
// the ledger) until the window passes.

// maxSeen bounds the delivered answers and the tools' latest calls the proxy remembers.
const maxSeen = 1 << 16

// seen is what the proxy saw of calls over its life, shared by its sessions and namespaces.
type seen struct {
	mu        sync.Mutex
	delivered map[string]delivery // key → the outcome whose answer a host had
	order     []string            // keys of delivered, oldest first (eviction)
	began     map[string][2]began // namespace and operation → the two latest calls that began, of different keys
}

// delivery is an outcome (the residual's token) whose answer a host had, and when.
type delivery struct {
	token uint64
	at    time.Time
}

// began is a call that began (an attempt acquired) at a time.
type began struct {
	key string
	at  time.Time
}

// deliver records that a host had the answer of key's outcome token at now, and returns
// its undo, for an answer that did not reach the host after all: it puts back what was
// recorded of key before, unless key was delivered again meanwhile. (An undone key keeps
// its place in order, so it may be forgotten early: counted as not delivered, a retry.)
func (sn *seen) deliver(key string, token uint64, now time.Time) (undo func()) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.delivered == nil {
		sn.delivered = map[string]delivery{}
	}
	prev, had := sn.delivered[key]
	if !had {
		if len(sn.order) >= maxSeen {
			delete(sn.delivered, sn.order[0])
			sn.order = sn.order[1:]
		}
		sn.order = append(sn.order, key)
	}
	d := delivery{token: token, at: now}
	sn.delivered[key] = d
	return func() {
		sn.mu.Lock()
		defer sn.mu.Unlock()
		switch {
		case sn.delivered[key] != d:
		case had:
			sn.delivered[key] = prev
		default:
			delete(sn.delivered, key)
		}
	}
}

// start records that a call of operation op (in namespace ns) with key began at now.
func (sn *seen) start(ns, op, key string, now time.Time) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.began == nil || len(sn.began) >= maxSeen {
		sn.began = map[string][2]began{}
	}
	k := ns + "\x00" + op
	last := sn.began[k]
	if last[0].key != key {
		last[1] = last[0]
	}
	last[0] = began{key: key, at: now}
	sn.began[k] = last
}

// deliveredAt is when a host had the answer of key's outcome token (ok false: not known).
func (sn *seen) deliveredAt(key string, token uint64) (time.Time, bool) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	d, ok := sn.delivered[key]
	if !ok || d.token != token {
		return time.Time{}, false
	}
	return d.at, true
}

// beganAfter reports whether a call of op (in ns) with another key than key began after t.
func (sn *seen) beganAfter(ns, op, key string, t time.Time) bool {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	for _, b := range sn.began[ns+"\x00"+op] {
		if b.key != "" && b.key != key && b.at.After(t) {
			return true
		}
	}
	return false
}

// repeat is the proxy's judgement of an identical call over a success.
type repeat int

const (
	repeatReplay repeat = iota // a retry, or the policy's replay: answered from the ledger
	repeatSend                 // a new intent: begun again over the success
	repeatAsk                  // the host's user decides
)

// judgeRepeat judges a call identical to the success res (of operation op, in namespace
// ns), whose task was named by the call (explicit) or is the proxy's default, under rule;
// why says the reason, for the host's answer and the log.
func (p *Proxy) judgeRepeat(ns, op string, rule policy.Rule, explicit bool, res *interceptor.Result, now time.Time) (repeat, string) {
	if explicit {
		return repeatReplay, "the call names its task, so the same call again in that task is the same work"
	}
	mode := rule.RepeatMode()
	if mode == policy.RepeatsReplay {
		return repeatReplay, "the tool's policy answers identical calls from the ledger (repeats: replay)"
	}
	window := p.cfg.RepeatWindow
	if rule.RepeatWindow != 0 {
		window = time.Duration(rule.RepeatWindow)
	}
	if window < 0 {
		mode = policy.RepeatsSend
	}
	if mode == policy.RepeatsWindow && now.Sub(res.RecordedAt) >= window {
		return repeatSend, fmt.Sprintf("the earlier identical call was recorded %s ago, more than the repeat window of %v", ago(now, res.RecordedAt), window)
	}
	at, delivered := p.seen.deliveredAt(res.Key, res.Token)
	switch {
	case !delivered:
		return repeatReplay, "its earlier answer may not have reached the host (a timeout, a cancellation, a reconnect or a restart), so this is taken for a retry"
	case mode == policy.RepeatsSend:
		return repeatSend, "the host had the earlier answer and the tool's policy sends identical calls again (repeats: send)"
	case p.seen.beganAfter(ns, op, res.Key, at):
		return repeatSend, "another call of the same tool began after the host had the earlier answer"
	}
	return repeatAsk, fmt.Sprintf("the host had the earlier answer %s ago and nothing else of this tool ran since", ago(now, at))
}

// ago is how long before now t was, rounded for people.
func ago(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case d < time.Second:
		return "less than a second"
	case d < time.Minute:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}
