package evals

import "strconv"

// Outcome is the grade of one trial.
type Outcome string

// Trial outcomes, graded from the sink's log and the final beliefs of the workers.
const (
	// ExactlyOnce: one effect, and every worker that believes the task done names it.
	ExactlyOnce Outcome = "EXACTLY_ONCE"
	// Duplicated: the same action (same payload digest) was performed twice or more.
	Duplicated Outcome = "DUPLICATED"
	// Diverged: two different actions (different payload digests) for one intent.
	Diverged Outcome = "DIVERGED"
	// Lost: a worker believes the task done with an answer the sink gave (a job id), but the
	// sink performed no effect for it.
	Lost Outcome = "LOST"
	// Fabricated: a worker reports a success with a result the sink never returned for this
	// intent, or that names no effect the sink performed.
	Fabricated Outcome = "FABRICATED"
	// Blocked: no worker believes the task done; the subject failed closed and awaits
	// reconciliation (at most one effect). Correct, but a cost.
	Blocked Outcome = "BLOCKED"
)

// outcomeDocs defines each outcome in one sentence, for readers of the report.
var outcomeDocs = map[Outcome]string{
	ExactlyOnce: "the effect happened once, and every agent that believes the task done names that effect.",
	Blocked: "no agent believes the task done: the subject failed closed and waits for a probe or a person to " +
		"reconcile, with at most one effect (correct, but a cost).",
	Duplicated: "the same action (the same payload) was performed two or more times for one intended operation.",
	Diverged:   "two different actions (different payloads, e.g. a re-worded email) were performed for one intended operation.",
	Lost: "an agent believes the task done with an answer the upstream gave (a queued job's id), but no effect was " +
		"ever performed for it (the job later failed).",
	Fabricated: "an agent reports a success with a result the upstream never returned for this operation, or one " +
		"that names no effect that happened.",
}

// doc defines o in one sentence ("" for an unknown outcome).
func (o Outcome) doc() string { return outcomeDocs[o] }

// outcomes lists every outcome, best first.
var outcomes = []Outcome{ExactlyOnce, Blocked, Duplicated, Diverged, Lost, Fabricated}

// bad reports whether o breaks the exactly-once guarantee (anything but EXACTLY_ONCE and
// BLOCKED).
func (o Outcome) bad() bool { return o != ExactlyOnce && o != Blocked }

// Belief is what one worker process reported at the end of its run: what the agent would
// tell its user. Crashed workers report nothing.
type Belief struct {
	Worker string `json:"worker"`
	// State is "done" (the task believes the effect happened, with Result) or "blocked"
	// (refused, fail closed, awaiting reconciliation, gave up).
	State string `json:"state"`
	// Result is the effect id (or job id) the worker believes it got.
	Result string `json:"result,omitempty"`
	// Reconciled counts residuals this worker settled through a probe.
	Reconciled int `json:"reconciled,omitempty"`
	// Reason says why a worker is blocked (the violation kind, the error).
	Reason string `json:"reason,omitempty"`
	// Intent is set by stress workers, which run many intents in one process.
	Intent string `json:"intent,omitempty"`
}

// Belief states.
const (
	BeliefDone    = "done"
	BeliefBlocked = "blocked"
)

// Grade is the graded outcome of one trial.
type Grade struct {
	Outcome Outcome `json:"outcome"`
	// Effects is how many effects the sink performed for the intent.
	Effects int `json:"effects"`
	// Reconciled is the number of residuals settled automatically by probes.
	Reconciled int    `json:"reconciled"`
	Detail     string `json:"detail,omitempty"`
}

// gradeTrial grades one trial from the sink's records of its intent (records of other
// intents are ignored) and the beliefs of the workers that finished. It is a pure function:
// the subject's own records are never consulted, only what it told its user.
//
// Rules, worst first: two or more effects with different payload digests are DIVERGED, with
// one digest DUPLICATED; a "done" belief whose result the sink never returned for the intent
// is FABRICATED; one whose result names a returned id without an effect (a queued job that
// failed) is LOST, and so is one naming another effect than the one performed; otherwise a
// done belief over the single effect is EXACTLY_ONCE, and no done belief is BLOCKED.
func gradeTrial(intent string, recs []record, beliefs []Belief) Grade {
	var effects []record
	returned := map[string]string{} // id or job → effect id ("" when none)
	jobEffect := map[string]string{}
	for _, r := range recs {
		if r.Intent != intent {
			continue
		}
		switch r.Kind {
		case kindEffect:
			effects = append(effects, r)
			returned[r.ID] = r.ID
			if r.Job != "" {
				jobEffect[r.Job] = r.ID
			}
		case kindAccepted:
			if _, ok := returned[r.Job]; !ok {
				returned[r.Job] = ""
			}
		}
	}
	for job, eff := range jobEffect {
		returned[job] = eff
	}
	g := Grade{Effects: len(effects)}
	for _, b := range beliefs {
		g.Reconciled += b.Reconciled
	}
	if len(effects) >= 2 {
		g.Outcome = Duplicated
		for _, e := range effects[1:] {
			if e.Digest != effects[0].Digest {
				g.Outcome = Diverged
			}
		}
		g.Detail = plural(len(effects), "effect")
		return g
	}
	done := 0
	worst := ExactlyOnce
	for _, b := range beliefs {
		if b.State != BeliefDone {
			continue
		}
		done++
		eff, ok := returned[b.Result]
		switch {
		case !ok:
			worst, g.Detail = Fabricated, b.Worker+" reports "+quote(b.Result)+", which the sink never returned for this intent"
		case eff == "" || len(effects) == 0 || eff != effects[0].ID:
			if worst != Fabricated {
				worst, g.Detail = Lost, b.Worker+" reports "+quote(b.Result)+", which names no effect the sink performed"
			}
		}
	}
	switch {
	case worst != ExactlyOnce:
		g.Outcome = worst
	case done == 0:
		g.Outcome = Blocked
	default:
		g.Outcome = ExactlyOnce
	}
	return g
}

func quote(s string) string { return `"` + s + `"` }

func plural(n int, word string) string {
	s := strconv.Itoa(n) + " " + word
	if n != 1 {
		s += "s"
	}
	return s
}
