package jepsen

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/toolfence/toolfence/residual"
)

// Verdict is the checked result of a history.
type Verdict struct {
	// Linearizable is porcupine's answer: "Ok", "Illegal" or "Unknown" (the check timed out).
	Linearizable string `json:"linearizable"`
	// IllegalKeys are the keys whose sub-history has no linearization.
	IllegalKeys []string `json:"illegal_keys,omitempty"`
	// Violations of the invariants checked beside linearizability.
	Violations []string `json:"violations,omitempty"`
	// Counts by step kind and result.
	Ops           int            `json:"ops"`
	Indeterminate int            `json:"indeterminate"`
	ByResult      map[string]int `json:"by_result"`
	Keys          int            `json:"keys"`
	CheckTime     string         `json:"check_time"`
	// Visualization is the HTML file of the shortest failing window, when one was written.
	Visualization string `json:"visualization,omitempty"`
	// Window describes where the first illegal key's check got stuck, one op a line
	// (client, call and return in ms from the key's first call); see failingWindow.
	Window []string `json:"window,omitempty"`
	// MoreWindows does the same for the next illegal keys (up to 9 more).
	MoreWindows map[string][]string `json:"more_windows,omitempty"`
}

// OK reports whether the history passed every check (an Unknown linearizability answer is
// not OK).
func (v *Verdict) OK() bool { return v.Linearizable == string(porcupine.Ok) && len(v.Violations) == 0 }

// String summarises the verdict in one line.
func (v *Verdict) String() string {
	s := fmt.Sprintf("%d ops (%d indeterminate) on %d keys: linearizable=%s, %d invariant violations",
		v.Ops, v.Indeterminate, v.Keys, v.Linearizable, len(v.Violations))
	if len(v.IllegalKeys) > 0 {
		s += ", illegal keys " + strings.Join(v.IllegalKeys, " ")
	}
	return s
}

// porcupineOps turns the history into porcupine operations. Reads without an answer impose
// nothing and are left out; indeterminate writes return at the end of the history.
func porcupineOps(ops []*Op) []porcupine.Operation {
	var end int64
	for _, op := range ops {
		end = max(end, op.Call, op.Return)
	}
	var out []porcupine.Operation
	for _, op := range ops {
		if op.In.Kind == KGet && (op.Out.Result == RIndeterminate || op.Out.Result == RFail) {
			continue
		}
		lo, hi := window(op)
		ret := op.Return
		if op.Out.Result == RIndeterminate {
			ret = end + 1
		}
		if answersLater(op) {
			write, answer := stepIn{op: op, lo: lo, hi: hi, part: partWrite}, stepIn{op: op, lo: lo, hi: hi, part: partAnswer}
			out = append(out,
				porcupine.Operation{ClientId: op.Client, Input: write, Call: op.Call, Output: op.Out, Return: ret},
				porcupine.Operation{ClientId: op.Client, Input: answer, Call: op.Call, Output: op.Out, Return: ret})
			continue
		}
		out = append(out, porcupine.Operation{ClientId: op.Client, Input: stepIn{op: op, lo: lo, hi: hi},
			Call: op.Call, Output: op.Out, Return: ret})
	}
	return out
}

// answersLater reports whether op is an acknowledged write that the ledger may answer with
// the residual as read after the write rather than at it: a Commit, Resolve or
// AppendEvidence whose reply was lost is retried inside the ledger, which recognises its
// own write and answers with the residual as the retry reads it, after other steps may
// have landed; so is a Commit refused (lease lost), whose refusal the ledger records as
// evidence. Such an op is checked as two steps in its window: the write (partWrite), then
// a read of its answer (partAnswer), which the model orders after the write.
func answersLater(op *Op) bool {
	switch op.In.Kind {
	case KCommit:
		return (op.Out.Result == ROK || op.Out.Result == RLeaseLost) && op.Out.HasRes
	case KResolve, KEvidence:
		return op.Out.Result == ROK && op.Out.HasRes
	}
	return false
}

// Check checks ops for linearizability against Model and for the invariants. timeout bounds
// porcupine. When dir is not empty and the history is not linearizable, the shortest failing
// prefix of the first illegal key is visualised in dir/violation.html.
func Check(ops []*Op, timeout time.Duration, dir string) *Verdict {
	start := time.Now()
	v := &Verdict{Ops: len(ops), ByResult: map[string]int{}}
	keys := map[string]bool{}
	for _, op := range ops {
		v.ByResult[string(op.In.Kind)+":"+string(op.Out.Result)]++
		if op.Out.Result == RIndeterminate {
			v.Indeterminate++
		}
		if op.In.Kind != KGC {
			keys[op.In.Key] = true
		}
	}
	v.Keys = len(keys)
	pops := expandGC(porcupineOps(ops), keys)
	model := Model()
	res, _ := porcupine.CheckOperationsVerbose(model, pops, timeout)
	v.Linearizable = string(res)
	if res == porcupine.Illegal {
		byKey := map[string][]porcupine.Operation{}
		for _, p := range pops {
			k := p.Input.(stepIn).op.In.Key
			byKey[k] = append(byKey[k], p)
		}
		var names []string
		for k := range byKey {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			if porcupine.CheckOperationsTimeout(model, byKey[k], timeout) == porcupine.Illegal {
				v.IllegalKeys = append(v.IllegalKeys, k)
			}
		}
		for _, k := range v.IllegalKeys[min(1, len(v.IllegalKeys)):min(10, len(v.IllegalKeys))] {
			_, info := porcupine.CheckOperationsVerbose(model, byKey[k], timeout)
			if v.MoreWindows == nil {
				v.MoreWindows = map[string][]string{}
			}
			v.MoreWindows[k] = failingWindow(byKey[k], info)
		}
		if len(v.IllegalKeys) > 0 {
			keyOps := byKey[v.IllegalKeys[0]]
			_, info := porcupine.CheckOperationsVerbose(model, keyOps, timeout)
			v.Window = failingWindow(keyOps, info)
			if dir != "" {
				path := filepath.Join(dir, "violation.html")
				if err := porcupine.VisualizePath(model, info, path); err == nil {
					v.Visualization = path
				} else {
					v.Violations = append(v.Violations, "could not write the visualisation: "+err.Error())
				}
			}
		}
	}
	v.Violations = append(v.Violations, invariants(ops)...)
	v.CheckTime = time.Since(start).Round(time.Millisecond).String()
	return v
}

// expandGC copies every GC op into the partition of each key whose ops it overlaps (GC
// touches every key). A GC wholly before a key's first op or after its last one changes
// nothing the key's ops could see, so it is left out of that partition.
func expandGC(pops []porcupine.Operation, keys map[string]bool) []porcupine.Operation {
	type span struct{ lo, hi int64 }
	spans := map[string]*span{}
	var out, gcs []porcupine.Operation
	for _, p := range pops {
		in := p.Input.(stepIn)
		if in.op.In.Kind == KGC {
			gcs = append(gcs, p)
			continue
		}
		out = append(out, p)
		k := in.op.In.Key
		if sp := spans[k]; sp == nil {
			spans[k] = &span{p.Call, p.Return}
		} else {
			sp.lo, sp.hi = min(sp.lo, p.Call), max(sp.hi, p.Return)
		}
	}
	for _, p := range gcs {
		in := p.Input.(stepIn)
		for k := range keys {
			if sp := spans[k]; sp == nil || p.Return < sp.lo || p.Call > sp.hi {
				continue
			}
			c := *in.op
			c.In.Key = k
			q := p
			q.Input = stepIn{op: &c, lo: in.lo, hi: in.hi}
			out = append(out, q)
		}
	}
	return out
}

// leaseSeen is one acquired lease as the history saw it, on the ledger's clock.
type leaseSeen struct {
	key, holder   string
	token         uint64
	start, end    int64 // end: the latest expiry seen, or the commit that released it
	endKnown      bool  // no indeterminate renewal or commit may have moved end
	committed     bool
	maxExpiry     int64
	unknownRenews bool
}

// invariants checks the fencing properties beside linearizability.
func invariants(ops []*Op) []string {
	var out []string
	type tok struct {
		token     uint64
		call, ret int64
		what      string
	}
	tokens := map[string][]tok{}
	leases := map[string]*leaseSeen{} // key/token
	lk := func(key string, token uint64) string { return fmt.Sprintf("%s/%d", key, token) }
	for _, op := range ops {
		i, o := op.In, op.Out
		if o.Result != ROK {
			continue
		}
		switch {
		case i.Kind == KReserve && o.Decision == "acquired":
			tokens[i.Key] = append(tokens[i.Key], tok{o.Token, op.Call, op.Return, describeOp(op)})
			leases[lk(i.Key, o.Token)] = &leaseSeen{key: i.Key, holder: i.Holder, token: o.Token, start: o.Started,
				end: o.Expires, maxExpiry: o.Expires, endKnown: true}
		case i.Kind == KResolve && o.Issued != 0:
			tokens[i.Key] = append(tokens[i.Key], tok{o.Issued, op.Call, op.Return, describeOp(op)})
		}
	}
	// Renewals and commits, in call order.
	for _, op := range ops {
		i, o := op.In, op.Out
		l := leases[lk(i.Key, i.Token)]
		if l == nil {
			continue
		}
		switch {
		case i.Kind == KRenew && o.Result == ROK:
			l.maxExpiry = max(l.maxExpiry, o.Expires)
			if !l.committed {
				l.end = max(l.end, o.Expires)
			}
		case i.Kind == KRenew && (o.Result == RIndeterminate || o.Result == RFail):
			l.unknownRenews, l.endKnown = true, false
		case i.Kind == KCommit && (o.Result == RIndeterminate || o.Result == RFail):
			l.endKnown = false // it may have released the lease early
		case i.Kind == KCommit && o.Result == ROK:
			l.committed = true
			l.end = min(l.end, o.Ended)
		}
	}
	// 1. Tokens strictly increase per key and never repeat.
	for key, ts := range tokens {
		seen := map[uint64]string{}
		for _, t := range ts {
			if prev, dup := seen[t.token]; dup {
				out = append(out, fmt.Sprintf("token %d issued twice on %s: %s and %s", t.token, key, prev, t.what))
			}
			seen[t.token] = t.what
		}
		for _, a := range ts {
			for _, b := range ts {
				if a.ret < b.call && a.token >= b.token {
					out = append(out, fmt.Sprintf("token went backwards on %s: %s returned before %s was called", key, a.what, b.what))
				}
			}
		}
	}
	// 2. No two live leases on one key at one instant (ledger clock).
	byKey := map[string][]*leaseSeen{}
	for _, l := range leases {
		byKey[l.key] = append(byKey[l.key], l)
	}
	for key, ls := range byKey {
		sort.Slice(ls, func(i, j int) bool { return ls[i].start < ls[j].start })
		for i := 1; i < len(ls); i++ {
			a, b := ls[i-1], ls[i]
			if a.endKnown && b.start < a.end {
				out = append(out, fmt.Sprintf("two live leases on %s: token %d (%s) live until %s and token %d (%s) from %s",
					key, a.token, a.holder, fmtT(a.end), b.token, b.holder, fmtT(b.start)))
			}
		}
	}
	// 3. No commit under a stale token: not after a newer token was acknowledged, not past
	// its lease (less the margin) on the ledger's clock.
	for _, op := range ops {
		i, o := op.In, op.Out
		if i.Kind != KCommit || o.Result != ROK {
			continue
		}
		for _, t := range tokens[i.Key] {
			if t.token > i.Token && t.ret < op.Call {
				out = append(out, fmt.Sprintf("commit under stale token %d on %s: %s was acknowledged before it", i.Token, i.Key, t.what))
			}
		}
		if l := leases[lk(i.Key, i.Token)]; l != nil && !l.unknownRenews && o.Ended+int64(i.Margin) >= l.maxExpiry {
			out = append(out, fmt.Sprintf("commit on %s at %s under token %d whose lease ended at %s (margin %v)",
				i.Key, fmtT(o.Ended), i.Token, fmtT(l.maxExpiry), i.Margin))
		}
	}
	// 4. An acknowledged write is never lost: a later read never shows a lower token or
	// fewer attempts of the same token than an acknowledged step left.
	type mark struct {
		ret      int64
		token    uint64
		state    residual.State
		what     string
		terminal bool
	}
	acked := map[string][]mark{}
	for _, op := range ops {
		i, o := op.In, op.Out
		if o.Result != ROK || !o.HasRes {
			continue
		}
		if i.Kind == KReserve && o.Decision == "acquired" || i.Kind == KResolve || i.Kind == KCommit {
			acked[i.Key] = append(acked[i.Key], mark{op.Return, o.Token, o.State, describeOp(op), o.State.Terminal()})
		}
	}
	for _, op := range ops {
		i, o := op.In, op.Out
		if o.Result != ROK || !o.HasRes || i.Kind != KGet {
			continue
		}
		for _, m := range acked[i.Key] {
			if m.ret < op.Call && o.Token < m.token {
				out = append(out, fmt.Sprintf("acknowledged write lost on %s: %s, then %s", i.Key, m.what, describeOp(op)))
			}
			if m.ret < op.Call && m.terminal && o.Token == m.token && o.State != m.state {
				out = append(out, fmt.Sprintf("acknowledged outcome lost on %s: %s, then %s", i.Key, m.what, describeOp(op)))
			}
		}
	}
	// 5. A reader that saw unknown never later sees succeeded under the same token without
	// a recorded resolution.
	type seen struct {
		ret      int64
		token    uint64
		resolved int
		what     string
	}
	unknowns := map[string][]seen{}
	for _, op := range ops {
		o := op.Out
		if o.Result == ROK || o.Result == RLeaseLost {
			if o.HasRes && o.State == residual.Unknown {
				unknowns[op.In.Key] = append(unknowns[op.In.Key], seen{op.Return, o.Token, o.Resolved, describeOp(op)})
			}
		}
	}
	for _, op := range ops {
		o := op.Out
		if !o.HasRes || o.State != residual.Succeeded || o.Result != ROK && o.Result != RLeaseLost {
			continue
		}
		for _, u := range unknowns[op.In.Key] {
			if u.ret < op.Call && u.token == o.Token && u.resolved == o.Resolved {
				out = append(out, fmt.Sprintf("unknown became succeeded without a resolution on %s: %s, then %s", op.In.Key, u.what, describeOp(op)))
			}
		}
	}
	sort.Strings(out)
	return dedupe(out)
}

func dedupe(s []string) []string {
	var out []string
	for i, x := range s {
		if i == 0 || x != s[i-1] {
			out = append(out, x)
		}
	}
	return out
}

// WriteVerdict writes the verdict as JSON beside the history.
func WriteVerdict(dir string, v *Verdict) error {
	b, err := jsonIndent(v)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "verdict.json"), b, 0o644)
}

// failingWindow describes where the check of one key's operations got stuck: the op that
// no linearization could place (the earliest-returning op outside the longest partial
// linearization, marked ✗) and every op that overlaps the second before it, one a line with
// times in ms from the key's first call (GC excepted). A prefix of a history is not a smaller
// counterexample (ops called later may linearize earlier), so the window is cut from the
// whole key's history, which porcupine's visualisation shows in full.
func failingWindow(ops []porcupine.Operation, info porcupine.LinearizationInfo) []string {
	if len(ops) == 0 {
		return nil
	}
	type stepKey struct {
		op   *Op
		part part
	}
	key := func(p porcupine.Operation) stepKey { in := p.Input.(stepIn); return stepKey{in.op, in.part} }
	done := map[stepKey]bool{}
	if parts := info.PartialLinearizationsOperations(); len(parts) > 0 {
		longest := []porcupine.Operation{}
		for _, l := range parts[0] {
			if len(l) > len(longest) {
				longest = l
			}
		}
		for _, p := range longest {
			done[key(p)] = true
		}
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	var stuck *porcupine.Operation
	for i := range ops {
		if !done[key(ops[i])] && (stuck == nil || ops[i].Return < stuck.Return) {
			stuck = &ops[i]
		}
	}
	if stuck == nil {
		return nil
	}
	t0 := ops[0].Call
	for _, p := range ops {
		if p.Input.(stepIn).op.In.Kind != KGC { // an indeterminate GC may start long before
			t0 = p.Call
			break
		}
	}
	var out []string
	for _, p := range ops {
		if p.Call > stuck.Return || p.Return < stuck.Call-int64(time.Second) {
			continue
		}
		op := p.Input.(stepIn).op
		ret := "∞"
		if op.Out.Result != RIndeterminate {
			ret = fmt.Sprintf("%.1f", float64(op.Return-t0)/1e6)
		}
		mark := " "
		if key(p) == key(*stuck) {
			mark = "✗"
		}
		half := map[part]string{partWrite: " (its write)", partAnswer: " (its answer, read after the write)"}[p.Input.(stepIn).part]
		out = append(out, fmt.Sprintf("%s c%d [%.1f, %s] %s%s", mark, op.Client, float64(op.Call-t0)/1e6, ret, describeOp(op), half))
	}
	return out
}
