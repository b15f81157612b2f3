package evals

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGradeTrial(t *testing.T) {
	t.Parallel()
	const intent = "inv-1"
	eff := func(seq int64, id, digest string) record {
		return record{Seq: seq, Kind: kindEffect, Intent: intent, ID: id, Digest: digest}
	}
	done := func(w, result string) Belief { return Belief{Worker: w, State: BeliefDone, Result: result} }
	blocked := func(w string) Belief { return Belief{Worker: w, State: BeliefBlocked, Reason: "unknown_outcome"} }
	other := record{Seq: 9, Kind: kindEffect, Intent: "inv-other", ID: "e-9", Digest: "d"}

	cases := []struct {
		name    string
		recs    []record
		beliefs []Belief
		want    Outcome
		effects int
	}{
		{"one effect, reported", []record{eff(1, "e-1", "d1")}, []Belief{done("w2", "e-1")}, ExactlyOnce, 1},
		{"one effect, every done worker names it", []record{eff(1, "e-1", "d1")}, []Belief{done("w1", "e-1"), blocked("z"), done("w3", "e-1")}, ExactlyOnce, 1},
		{"other intents are ignored", []record{other, eff(2, "e-1", "d1")}, []Belief{done("w", "e-1")}, ExactlyOnce, 1},
		{"same action twice", []record{eff(1, "e-1", "d1"), eff(2, "e-2", "d1")}, []Belief{done("w2", "e-2")}, Duplicated, 2},
		{"duplicates win over a correct report", []record{eff(1, "e-1", "d1"), eff(2, "e-2", "d1"), eff(3, "e-3", "d1")}, []Belief{done("w", "e-1")}, Duplicated, 3},
		{"two different actions", []record{eff(1, "e-1", "d1"), eff(2, "e-2", "d2")}, []Belief{done("w2", "e-2")}, Diverged, 2},
		{"success with a result the sink never returned", []record{eff(1, "e-1", "d1")}, []Belief{done("w2", "e-77")}, Fabricated, 1},
		{"success with no effect at all", nil, []Belief{done("w1", "cached-ok")}, Fabricated, 0},
		{"success naming another intent's effect", []record{other}, []Belief{done("w1", "e-9")}, Fabricated, 0},
		{"queued job that failed, believed done", []record{
			{Seq: 1, Kind: kindAccepted, Intent: intent, Job: "j-1"},
			{Seq: 2, Kind: kindJobFailed, Intent: intent, Job: "j-1"},
		}, []Belief{done("w1", "j-1")}, Lost, 0},
		{"queued job that completed, reported by job id", []record{
			{Seq: 1, Kind: kindAccepted, Intent: intent, Job: "j-1"},
			{Seq: 2, Kind: kindEffect, Intent: intent, Job: "j-1", ID: "e-5", Digest: "d1"},
		}, []Belief{done("w1", "j-1")}, ExactlyOnce, 1},
		{"failed job then a retry's effect, reported by the failed job", []record{
			{Seq: 1, Kind: kindAccepted, Intent: intent, Job: "j-1"},
			{Seq: 2, Kind: kindJobFailed, Intent: intent, Job: "j-1"},
			eff(3, "e-2", "d1"),
		}, []Belief{done("w1", "j-1")}, Lost, 1},
		{"effect, nobody believes it done", []record{eff(1, "e-1", "d1")}, []Belief{blocked("w2")}, Blocked, 1},
		{"no effect, fail closed", nil, []Belief{blocked("w1"), blocked("w2")}, Blocked, 0},
		{"no worker finished", []record{eff(1, "e-1", "d1")}, nil, Blocked, 1},
		{"fabricated beats lost", []record{
			{Seq: 1, Kind: kindAccepted, Intent: intent, Job: "j-1"},
			{Seq: 2, Kind: kindJobFailed, Intent: intent, Job: "j-1"},
		}, []Belief{done("a", "j-1"), done("b", "zzz")}, Fabricated, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			g := gradeTrial(intent, c.recs, c.beliefs)
			require.Equal(t, c.want, g.Outcome, g.Detail)
			require.Equal(t, c.effects, g.Effects)
		})
	}
}

func TestGradeCountsReconciled(t *testing.T) {
	t.Parallel()
	g := gradeTrial("i", []record{{Kind: kindEffect, Intent: "i", ID: "e-1", Digest: "d"}},
		[]Belief{{State: BeliefDone, Result: "e-1", Reconciled: 1}, {State: BeliefBlocked, Reconciled: 2}})
	require.Equal(t, ExactlyOnce, g.Outcome)
	require.Equal(t, 3, g.Reconciled)
}

func TestOutcomeBad(t *testing.T) {
	t.Parallel()
	for _, o := range outcomes {
		require.Equal(t, o != ExactlyOnce && o != Blocked, o.bad(), o)
	}
}

func TestReadLog(t *testing.T) {
	t.Parallel()
	log := `{"seq":1,"kind":"effect","intent":"a","id":"e-1","digest":"x","at":"2026-01-01T00:00:00Z"}
{"seq":2,"kind":"accepted","intent":"b","job":"j-1","at":"2026-01-01T00:00:00Z"}
{"seq":3,"kind":"eff`
	recs, err := readLog(strings.NewReader(log))
	require.NoError(t, err, "a torn last line is ignored")
	require.Len(t, recs, 2)
	require.Equal(t, "e-1", recs[0].ID)
	require.Equal(t, "j-1", recs[1].Job)

	_, err = readLog(strings.NewReader("garbage\n" + `{"seq":1,"kind":"effect","intent":"a"}` + "\n"))
	require.ErrorContains(t, err, "line 1")
}
