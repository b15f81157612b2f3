package jepsen

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// never is the ledger time of "no bound": the return of an indeterminate op, or the expiry
// of a lease whose start nobody observed.
const never = math.MaxInt64 / 4

// maxEvidence is the ledger's cap on kept evidence, written out (not ledger.MaxEvidence,
// which is moving to ledger/rules) so that the model states the contract on its own; a
// ledger that kept more or fewer would fail the check on a key with that many observations.
const maxEvidence = 32

// keyState is the model of one key: the residual states and steps of the ledger contract reduced to
// what the workload can observe. It is a comparable value (porcupine compares states with ==).
type keyState struct {
	Exists bool
	// State is the stored state; a pending one reads as unknown once its lease expired.
	State  residual.State
	Token  uint64 // highest token issued for the key; GC never resets it
	Holder string
	Digest string
	// ExpLo..ExpHi bound the current lease's expiry (ledger time, ns): equal when a
	// client saw it, open-ended when the step that set it was indeterminate.
	ExpLo, ExpHi int64
	Attempts     int
	Evidence     int
	Resolutions  int
	// Owed lists the ids (",id,") of split writes that took effect and whose answer (a
	// read, see answersLater) has not been placed yet.
	Owed string
}

// stepIn is porcupine's input: the op and the ledger-time window it ran in, and for an op
// split by answersLater, which part it is.
type stepIn struct {
	op     *Op
	lo, hi int64
	part   part
}

// part says which half of a split op a stepIn is.
type part int

const (
	whole      part = iota
	partWrite       // the write, its answer not checked
	partAnswer      // the answer, a read placed after the write
)

// owedID is op's entry in keyState.Owed.
func owedID(op *Op) string { return fmt.Sprintf(",%d,", op.ID) }

// window returns the ledger-time window of op: from its call to its return, shifted by the
// ledger clock's offset; an indeterminate op's window never closes.
func window(op *Op) (lo, hi int64) {
	lo = op.Call + op.OffCall
	hi = never
	if op.Out.Result != RIndeterminate {
		hi = op.Return + op.OffRet
	}
	return lo, hi
}

// times returns the window of ledger time the step read the clock in. The model keeps no
// clock of its own across steps: a backend may read its clock before the step's
// linearization point (badger at the start of an optimistic transaction, PostgreSQL at a
// statement's start), so clock readings need not grow in linearization order; each step is
// judged at a time within its own window.
func (s keyState) times(in stepIn) (lo, hi int64, ok bool) {
	return in.lo, in.hi, in.lo <= in.hi
}

// canLive reports whether the lease may have more than margin left at some t in [lo, hi];
// canExpired whether it may have margin or less left.
func (s keyState) canLive(lo int64, margin int64) bool { return lo < s.ExpHi-margin }
func (s keyState) canExpired(hi int64, margin int64) bool {
	return hi >= s.ExpLo-margin
}

// effective returns the effective states the key may read as in [lo, hi].
func (s keyState) effective(lo, hi int64) []residual.State {
	if !s.Exists {
		return []residual.State{residual.None}
	}
	if s.State != residual.Pending {
		return []residual.State{s.State}
	}
	var out []residual.State
	if s.canLive(lo, 0) {
		out = append(out, residual.Pending)
	}
	if s.canExpired(hi, 0) {
		out = append(out, residual.Unknown)
	}
	return out
}

// matches reports whether o describes s read as eff.
func (s keyState) matches(o *Output, eff residual.State) bool {
	return o.HasRes && o.State == eff && o.Token == s.Token && o.Attempts == s.Attempts &&
		o.Evidence == s.Evidence && o.Resolutions() == s.Resolutions && o.Holder == s.Holder
}

// Resolutions returns the number of resolutions the output saw.
func (o *Output) Resolutions() int { return o.Resolved }

// decide is ledger.Decide over the model.
func (s keyState) decide(eff residual.State, digest string, redispatch bool) ledger.Decision {
	switch eff {
	case residual.None:
		return ledger.Acquired
	case residual.Pending:
		return ledger.InProgress
	case residual.Unknown:
		if redispatch && s.Digest == digest {
			return ledger.Acquired
		}
		return ledger.UnknownOutcome
	case residual.Accepted:
		return ledger.AwaitingUpstream
	case residual.Succeeded:
		if s.Digest == digest {
			return ledger.Replay
		}
		return ledger.PayloadMismatch
	}
	return ledger.Acquired // failed
}

// acquire is the state after a Reserve that acquired with a lease expiring in [expLo, expHi].
func (s keyState) acquire(in Input, expLo, expHi int64) keyState {
	if !s.Exists {
		s.Attempts, s.Evidence, s.Resolutions = 0, 0, 0
	}
	s.Exists, s.State, s.Token, s.Holder, s.Digest = true, residual.Pending, s.Token+1, in.Holder, in.Digest
	s.ExpLo, s.ExpHi = expLo, expHi
	s.Attempts++
	return s
}

func (s keyState) settle(st residual.State) keyState {
	s.State, s.ExpLo, s.ExpHi = st, 0, 0
	return s
}

func (s keyState) withEvidence() keyState {
	s.Evidence = min(s.Evidence+1, maxEvidence)
	return s
}

// step returns every state the key may be in after in produced its output from s; none
// when it could not have.
func step(s keyState, in stepIn) []keyState {
	lo, hi, ok := s.times(in)
	if !ok {
		return nil
	}
	o := in.op.Out
	switch in.part {
	case partWrite:
		w := *o
		w.HasRes = false
		in.op = &Op{ID: in.op.ID, In: in.op.In, Out: &w}
		in.part = whole
		var out []keyState
		for _, n := range step(s, in) {
			n.Owed += owedID(in.op)
			out = append(out, n)
		}
		return out
	case partAnswer:
		id := owedID(in.op)
		if !strings.Contains(s.Owed, id) {
			return nil // the write has not taken effect yet
		}
		s.Owed = strings.Replace(s.Owed, id, "", 1)
		if !s.Exists {
			return nil
		}
		for _, eff := range s.effective(lo, hi) {
			if s.matches(o, eff) {
				return []keyState{s}
			}
		}
		return nil
	}
	switch o.Result {
	case RFail:
		return []keyState{s} // the ledger says it did not happen
	case RIndeterminate:
		return append([]keyState{s}, happened(s, in.op.In, lo, hi)...)
	}
	i := in.op.In
	switch i.Kind {
	case KReserve:
		return stepReserve(s, i, o, lo, hi)
	case KCommit:
		return stepCommit(s, i, o, lo, hi)
	case KRenew:
		return stepRenew(s, i, o, lo, hi)
	case KResolve:
		return stepResolve(s, i, o, lo, hi)
	case KEvidence:
		switch {
		case o.Result == RNotFound && !s.Exists:
			return []keyState{s}
		case o.Result == ROK && s.Exists:
			n := s.withEvidence()
			if !o.HasRes {
				return []keyState{n} // the write of a split op: see answersLater
			}
			for _, eff := range s.effective(lo, hi) {
				if n.matches(o, eff) {
					return []keyState{n}
				}
			}
		}
		return nil
	case KGet:
		switch {
		case o.Result == RNotFound && !s.Exists:
			return []keyState{s}
		case o.Result == ROK && s.Exists:
			for _, eff := range s.effective(lo, hi) {
				if s.matches(o, eff) {
					return []keyState{s}
				}
			}
		}
		return nil
	case KGC:
		return gc(s)
	}
	return nil
}

// gc: a settled residual may be deleted by a GC that overlaps it (GC is not one atomic
// step across keys); its token survives.
func gc(s keyState) []keyState {
	if !s.Exists || !s.State.Terminal() {
		return []keyState{s}
	}
	d := keyState{Token: s.Token, Owed: s.Owed}
	return []keyState{s, d}
}

// happened returns the states an indeterminate step may have left if it took effect at
// some time in [lo, hi].
func happened(s keyState, i Input, lo, hi int64) []keyState {
	var out []keyState
	switch i.Kind {
	case KReserve:
		for _, eff := range s.effective(lo, hi) {
			if s.decide(eff, i.Digest, i.Redispatch) == ledger.Acquired {
				out = append(out, s.acquire(i, lo+int64(i.TTL), never))
				break
			}
		}
	case KCommit:
		if fenceMayHold(s, i, lo) {
			out = append(out, s.settle(i.Outcome))
		}
		if s.Exists && fenceMayFail(s, i, hi) {
			out = append(out, s.withEvidence())
		}
	case KRenew:
		if fenceMayHold(s, Input{Holder: i.Holder, Token: i.Token}, lo) {
			n := s
			n.ExpLo, n.ExpHi = lo+int64(i.TTL), never
			out = append(out, n)
		}
	case KResolve:
		if mayResolve(s, lo, hi) {
			out = append(out, resolved(s, i.As))
		}
	case KEvidence:
		if s.Exists {
			out = append(out, s.withEvidence())
		}
	case KGC:
		return gc(s)
	}
	return out
}

func fenceMayHold(s keyState, i Input, lo int64) bool {
	return s.Exists && s.State == residual.Pending && s.Token == i.Token && s.Holder == i.Holder &&
		s.canLive(lo, int64(i.Margin))
}

func fenceMayFail(s keyState, i Input, hi int64) bool {
	return !s.Exists || s.State != residual.Pending || s.Token != i.Token || s.Holder != i.Holder ||
		s.canExpired(hi, int64(i.Margin))
}

func mayResolve(s keyState, lo, hi int64) bool {
	for _, eff := range s.effective(lo, hi) {
		if eff == residual.Unknown || eff == residual.Accepted {
			return true
		}
	}
	return false
}

func resolved(s keyState, as residual.State) keyState {
	s = s.settle(as)
	s.Token++
	s.Resolutions++
	return s
}

func stepReserve(s keyState, i Input, o *Output, lo, hi int64) []keyState {
	if o.Result != ROK {
		return nil
	}
	if o.Decision == ledger.Acquired.String() {
		// Judged at the attempt's start, the ledger's clock of the step.
		t := o.Started
		if t < lo || t > hi {
			return nil
		}
		for _, eff := range s.effective(t, t) {
			if s.decide(eff, i.Digest, i.Redispatch) != ledger.Acquired {
				continue
			}
			n := s.acquire(i, o.Expires, o.Expires)
			if o.Token != n.Token || o.Attempts != n.Attempts || o.Holder != i.Holder || o.Expires != t+int64(i.TTL) {
				return nil
			}
			return []keyState{n}
		}
		return nil
	}
	for _, eff := range s.effective(lo, hi) {
		if eff != residual.None && s.decide(eff, i.Digest, i.Redispatch).String() == o.Decision && s.matches(o, eff) {
			return []keyState{s}
		}
	}
	return nil
}

func stepCommit(s keyState, i Input, o *Output, lo, hi int64) []keyState {
	switch o.Result {
	case ROK:
		if !fenceMayHold(s, i, lo) {
			return nil
		}
		n := s.settle(i.Outcome)
		if o.HasRes && !n.matches(o, i.Outcome) { // see answersLater for one without
			return nil
		}
		return []keyState{n}
	case RLeaseLost:
		if !fenceMayFail(s, i, hi) {
			return nil
		}
		if !s.Exists {
			return []keyState{s}
		}
		n := s.withEvidence()
		if o.HasRes {
			ok := false
			for _, eff := range n.effective(lo, hi) {
				ok = ok || n.matches(o, eff)
			}
			if !ok {
				return nil
			}
		}
		return []keyState{n}
	}
	return nil
}

func stepRenew(s keyState, i Input, o *Output, lo, hi int64) []keyState {
	f := Input{Holder: i.Holder, Token: i.Token}
	switch o.Result {
	case ROK:
		if !fenceMayHold(s, f, lo) || o.Expires < lo+int64(i.TTL) || o.Expires > hi+int64(i.TTL) {
			return nil
		}
		n := s
		n.ExpLo, n.ExpHi = o.Expires, o.Expires
		return []keyState{n}
	case RLeaseLost:
		var out []keyState
		if fenceMayFail(s, f, hi) {
			out = append(out, s)
		}
		// A renew whose connection broke after it was sent is tried again; when the first
		// try extended the lease and the extended lease ran out before the retry read it,
		// the answer is lease_lost although the extension took effect: the lease ran until
		// some point in [lo+ttl, hi].
		if lo+int64(i.TTL) <= hi && fenceMayHold(s, f, lo) {
			n := s
			n.ExpLo, n.ExpHi = lo+int64(i.TTL), hi
			out = append(out, n)
		}
		return out
	}
	return nil
}

func stepResolve(s keyState, i Input, o *Output, lo, hi int64) []keyState {
	switch o.Result {
	case ROK:
		if !mayResolve(s, lo, hi) {
			return nil
		}
		n := resolved(s, i.As)
		if o.HasRes && !n.matches(o, i.As) { // see answersLater for one without
			return nil
		}
		return []keyState{n}
	case RNotFound:
		if s.Exists {
			return nil
		}
		return []keyState{s}
	case RInProgress:
		if s.Exists && s.State == residual.Pending && s.canLive(lo, 0) {
			return []keyState{s}
		}
	case RInvalidTransition:
		if s.Exists && s.State.Terminal() {
			return []keyState{s}
		}
	}
	return nil
}

// Model returns the porcupine model of the ledger, partitioned by key. Inputs are stepIn
// values built by checkInputs; outputs are *Output.
func Model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			var keys []string
			for _, op := range h {
				k := op.Input.(stepIn).op.In.Key
				if _, ok := by[k]; !ok {
					keys = append(keys, k)
				}
				by[k] = append(by[k], op)
			}
			sort.Strings(keys)
			out := make([][]porcupine.Operation, 0, len(keys))
			for _, k := range keys {
				out = append(out, by[k])
			}
			return out
		},
		Init: func() []any { return []any{keyState{}} },
		Step: func(state, input, _ any) []any {
			next := step(state.(keyState), input.(stepIn))
			out := make([]any, len(next))
			for i, n := range next {
				out[i] = n
			}
			return out
		},
		Equal: func(a, b any) bool { return a.(keyState) == b.(keyState) },
		DescribeOperation: func(input, _ any) string {
			return describeOp(input.(stepIn).op)
		},
		DescribeState: func(state any) string {
			s := state.(keyState)
			if !s.Exists {
				return fmt.Sprintf("none (token %d)", s.Token)
			}
			exp := ""
			if s.State == residual.Pending {
				exp = fmt.Sprintf(" lease %s..%s", fmtT(s.ExpLo), fmtT(s.ExpHi))
			}
			return fmt.Sprintf("%s token %d holder %s attempts %d evidence %d resolutions %d%s",
				s.State, s.Token, s.Holder, s.Attempts, s.Evidence, s.Resolutions, exp)
		},
	}
	return nm.ToModel()
}

func fmtT(t int64) string {
	if t >= never {
		return "∞"
	}
	return fmt.Sprintf("%.3f", float64(t%1e11)/1e9)
}

func describeOp(op *Op) string {
	i, o := op.In, op.Out
	var in string
	switch i.Kind {
	case KReserve:
		in = fmt.Sprintf("reserve(%s, %s, digest %s, ttl %v, redispatch %v)", i.Key, i.Holder, i.Digest, i.TTL, i.Redispatch)
	case KCommit:
		in = fmt.Sprintf("commit(%s, %s, token %d, %s, margin %v)", i.Key, i.Holder, i.Token, i.Outcome, i.Margin)
	case KRenew:
		in = fmt.Sprintf("renew(%s, %s, token %d, ttl %v)", i.Key, i.Holder, i.Token, i.TTL)
	case KResolve:
		in = fmt.Sprintf("resolve(%s, as %s, by %s)", i.Key, i.As, i.By)
	default:
		in = fmt.Sprintf("%s(%s)", i.Kind, i.Key)
	}
	out := string(o.Result)
	if o.Decision != "" {
		out += " " + o.Decision
	}
	if o.HasRes {
		out += fmt.Sprintf(" [%s token %d holder %s att %d ev %d res %d]", o.State, o.Token, o.Holder, o.Attempts, o.Evidence, o.Resolved)
	}
	if o.Expires != 0 {
		out += " expires " + fmtT(o.Expires)
	}
	return in + " → " + out
}
