package evals

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The parent keeps what it needs to grade every trial in a compact form until the run
// ends: a full run has about a million trials and two to three million sink records.

// keepAllTrials is the largest run (in trials, stress messages not counted) whose
// report.json lists every trial and stress message; beyond it the
// report keeps the cell counts, every toolfence trial that is not EXACTLY_ONCE, every trial
// with a harness error or a note, and the first keepPerBaselineCell failing trials of each
// baseline cell (a baseline fails most trials of most cells: listing them all would make a
// 10,000-trial report about 160 MB), and says how many it omitted, per cell and in all.
const (
	keepAllTrials       = 20_000
	keepPerBaselineCell = 1_000
)

// interner maps strings to small numbers and back.
type interner struct {
	mu  sync.Mutex
	ids map[string]uint32
	s   []string
}

func (in *interner) id(s string) uint32 {
	in.mu.Lock()
	defer in.mu.Unlock()
	if id, ok := in.ids[s]; ok {
		return id
	}
	if in.ids == nil {
		in.ids = map[string]uint32{}
	}
	id := uint32(len(in.s))
	in.ids[s] = id
	in.s = append(in.s, s)
	return id
}

func (in *interner) str(id uint32) string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.s[id]
}

// Sink ids ("e-12", "j-7") are kept as a kind and a number; anything else is interned.
const (
	idInterned uint8 = iota
	idEffect
	idJob
)

func (in *interner) encodeID(s string) (uint8, uint32) {
	if len(s) > 2 && s[1] == '-' && (s[0] == 'e' || s[0] == 'j') && s[2] != '0' {
		if n, err := strconv.ParseUint(s[2:], 10, 32); err == nil {
			if s[0] == 'e' {
				return idEffect, uint32(n)
			}
			return idJob, uint32(n)
		}
	}
	return idInterned, in.id(s)
}

func (in *interner) decodeID(kind uint8, n uint32) string {
	switch kind {
	case idEffect:
		return "e-" + strconv.FormatUint(uint64(n), 10)
	case idJob:
		return "j-" + strconv.FormatUint(uint64(n), 10)
	}
	return in.str(n)
}

// cbelief is a Belief without its intent (the slot knows it).
type cbelief struct {
	worker, reason, result uint32
	reconciled             uint16
	resultKind             uint8
	done                   bool
}

// crec is a sink record of a known intent, reduced to what grading reads.
type crec struct {
	digest        [32]byte
	id, job       uint32
	kind          uint8
	idKind, jKind uint8
}

// Record kinds in a crec.
var recKinds = []string{kindEffect, kindAccepted, kindJobFailed}

// slot is one trial's compact state.
type slot struct {
	beliefs []cbelief
	recs    []crec
	extra   *slotExtra // notes and harness errors, rare
	elapsed time.Duration
}

type slotExtra struct {
	notes []string
	err   string
}

// store holds the slots of every cell: cells[c][index].
type store struct {
	strs  interner
	cells map[string]int // scenario "\x00" subject → cell
	names [][2]string
	slots [][]slot
}

func newStore() *store { return &store{cells: map[string]int{}} }

// addCell adds the cell scenario × subject with n slots.
func (s *store) addCell(scenario, subject string, n int) {
	s.cells[scenario+"\x00"+subject] = len(s.slots)
	s.names = append(s.names, [2]string{scenario, subject})
	s.slots = append(s.slots, make([]slot, n))
}

// cell returns the slots of scenario × subject.
func (s *store) cell(scenario, subject string) []slot {
	c, ok := s.cells[scenario+"\x00"+subject]
	if !ok {
		return nil
	}
	return s.slots[c]
}

// put stores one finished trial; distinct trials may be put concurrently.
func (s *store) put(scenario, subject string, index int, beliefs []Belief, notes []string, harnessErr string, elapsed time.Duration) {
	sl := &s.cell(scenario, subject)[index]
	sl.elapsed = elapsed
	for _, b := range beliefs {
		cb := cbelief{worker: s.strs.id(b.Worker), reason: s.strs.id(b.Reason), done: b.State == BeliefDone,
			reconciled: uint16(min(b.Reconciled, 1<<16-1))}
		if b.State != BeliefDone && b.State != BeliefBlocked {
			cb.reason = s.strs.id("state " + b.State + ": " + b.Reason)
		}
		cb.resultKind, cb.result = s.strs.encodeID(b.Result)
		sl.beliefs = append(sl.beliefs, cb)
	}
	if len(notes) > 0 || harnessErr != "" {
		sl.extra = &slotExtra{notes: notes, err: harnessErr}
	}
}

// trialOf returns the slot of a sink record's intent: "inv-<scenario>.<subject>.b<k>.<index>"
// for trials, stressIntent for stress messages; nil for an intent of no trial.
func (s *store) trialOf(intent string) *slot {
	var sc, sub, idx string
	if rest, ok := strings.CutPrefix(intent, "inv-"); ok {
		parts := strings.Split(rest, ".")
		if len(parts) != 4 {
			return nil
		}
		sc, sub, idx = parts[0], parts[1], parts[3]
	} else {
		parts := strings.Split(intent, ".")
		if len(parts) != 3 || parts[0] != stressScenario || !strings.HasPrefix(parts[2], "msg-") {
			return nil
		}
		sc, sub, idx = parts[0], parts[1], strings.TrimPrefix(parts[2], "msg-")
	}
	n, err := strconv.Atoi(idx)
	if err != nil {
		return nil
	}
	cell := s.cell(sc, sub)
	if n < 0 || n >= len(cell) {
		return nil
	}
	return &cell[n]
}

// addRecord files a sink record under its trial; records of no trial are dropped.
func (s *store) addRecord(r record) {
	sl := s.trialOf(r.Intent)
	if sl == nil {
		return
	}
	c := crec{}
	for i, k := range recKinds {
		if r.Kind == k {
			c.kind = uint8(i + 1)
		}
	}
	if c.kind == 0 {
		c.kind = uint8(len(recKinds) + 1) // an unknown kind: grading ignores it
	}
	if b, err := hex.DecodeString(r.Digest); err == nil && len(b) == 32 {
		copy(c.digest[:], b)
	} else {
		c.digest = sha256.Sum256([]byte("raw:" + r.Digest)) // equal digests stay equal
	}
	c.idKind, c.id = s.strs.encodeID(r.ID)
	c.jKind, c.job = s.strs.encodeID(r.Job)
	sl.recs = append(sl.recs, c)
}

// records rebuilds the trial's sink records for gradeTrial.
func (s *store) records(intent string, sl *slot) []record {
	out := make([]record, len(sl.recs))
	for i, c := range sl.recs {
		kind := "unknown"
		if int(c.kind) <= len(recKinds) {
			kind = recKinds[c.kind-1]
		}
		out[i] = record{Seq: int64(i + 1), Kind: kind, Intent: intent, Digest: hex.EncodeToString(c.digest[:]),
			ID: s.strs.decodeID(c.idKind, c.id), Job: s.strs.decodeID(c.jKind, c.job)}
	}
	return out
}

// beliefs rebuilds the trial's beliefs.
func (s *store) beliefs(intent string, sl *slot, stress bool) []Belief {
	out := make([]Belief, len(sl.beliefs))
	for i, c := range sl.beliefs {
		b := Belief{Worker: s.strs.str(c.worker), State: BeliefBlocked, Reason: s.strs.str(c.reason),
			Result: s.strs.decodeID(c.resultKind, c.result), Reconciled: int(c.reconciled)}
		if c.done {
			b.State = BeliefDone
		}
		if stress {
			b.Intent = intent
		}
		out[i] = b
	}
	return out
}
