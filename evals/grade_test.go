package evals

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGradeTrial(t *testing.T) {
	t.Parallel()
	const intent = "inv-1"
	eff := func(seq int64, id, digest string) Record {
		return Record{Seq: seq, Kind: KindEffect, Intent: intent, ID: id, Digest: digest}
	}
	done := func(w, result string) Belief { return Belief{Worker: w, State: BeliefDone, Result: result} }
	blocked := func(w string) Belief { return Belief{Worker: w, State: BeliefBlocked, Reason: "unknown_outcome"} }
	other := Record{Seq: 9, Kind: KindEffect, Intent: "inv-other", ID: "e-9", Digest: "d"}

	cases := []struct {
		name    string
		recs    []Record
		beliefs []Belief
		want    Outcome
		effects int
	}{
		{"one effect, reported", []Record{eff(1, "e-1", "d1")}, []Belief{done("w2", "e-1")}, ExactlyOnce, 1},
		{"one effect, every done worker names it", []Record{eff(1, "e-1", "d1")}, []Belief{done("w1", "e-1"), blocked("z"), done("w3", "e-1")}, ExactlyOnce, 1},
		{"other intents are ignored", []Record{other, eff(2, "e-1", "d1")}, []Belief{done("w", "e-1")}, ExactlyOnce, 1},
		{"same action twice", []Record{eff(1, "e-1", "d1"), eff(2, "e-2", "d1")}, []Belief{done("w2", "e-2")}, Duplicated, 2},
		{"duplicates win over a correct report", []Record{eff(1, "e-1", "d1"), eff(2, "e-2", "d1"), eff(3, "e-3", "d1")}, []Belief{done("w", "e-1")}, Duplicated, 3},
		{"two different actions", []Record{eff(1, "e-1", "d1"), eff(2, "e-2", "d2")}, []Belief{done("w2", "e-2")}, Diverged, 2},
		{"success with a result the sink never returned", []Record{eff(1, "e-1", "d1")}, []Belief{done("w2", "e-77")}, Fabricated, 1},
		{"success with no effect at all", nil, []Belief{done("w1", "cached-ok")}, Fabricated, 0},
		{"success naming another intent's effect", []Record{other}, []Belief{done("w1", "e-9")}, Fabricated, 0},
		{"queued job that failed, believed done", []Record{
			{Seq: 1, Kind: KindAccepted, Intent: intent, Job: "j-1"},
			{Seq: 2, Kind: KindJobFailed, Intent: intent, Job: "j-1"},
		}, []Belief{done("w1", "j-1")}, Lost, 0},
		{"queued job that completed, reported by job id", []Record{
			{Seq: 1, Kind: KindAccepted, Intent: intent, Job: "j-1"},
			{Seq: 2, Kind: KindEffect, Intent: intent, Job: "j-1", ID: "e-5", Digest: "d1"},
		}, []Belief{done("w1", "j-1")}, ExactlyOnce, 1},
		{"failed job then a retry's effect, reported by the failed job", []Record{
			{Seq: 1, Kind: KindAccepted, Intent: intent, Job: "j-1"},
			{Seq: 2, Kind: KindJobFailed, Intent: intent, Job: "j-1"},
			eff(3, "e-2", "d1"),
		}, []Belief{done("w1", "j-1")}, Lost, 1},
		{"effect, nobody believes it done", []Record{eff(1, "e-1", "d1")}, []Belief{blocked("w2")}, Blocked, 1},
		{"no effect, fail closed", nil, []Belief{blocked("w1"), blocked("w2")}, Blocked, 0},
		{"no worker finished", []Record{eff(1, "e-1", "d1")}, nil, Blocked, 1},
		{"fabricated beats lost", []Record{
			{Seq: 1, Kind: KindAccepted, Intent: intent, Job: "j-1"},
			{Seq: 2, Kind: KindJobFailed, Intent: intent, Job: "j-1"},
		}, []Belief{done("a", "j-1"), done("b", "zzz")}, Fabricated, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			g := GradeTrial(intent, c.recs, c.beliefs)
			require.Equal(t, c.want, g.Outcome, g.Detail)
			require.Equal(t, c.effects, g.Effects)
		})
	}
}

func TestGradeCountsReconciled(t *testing.T) {
	t.Parallel()
	g := GradeTrial("i", []Record{{Kind: KindEffect, Intent: "i", ID: "e-1", Digest: "d"}},
		[]Belief{{State: BeliefDone, Result: "e-1", Reconciled: 1}, {State: BeliefBlocked, Reconciled: 2}})
	require.Equal(t, ExactlyOnce, g.Outcome)
	require.Equal(t, 3, g.Reconciled)
}

func TestOutcomeBad(t *testing.T) {
	t.Parallel()
	for _, o := range Outcomes {
		require.Equal(t, o != ExactlyOnce && o != Blocked, o.Bad(), o)
	}
}

func TestReadLog(t *testing.T) {
	t.Parallel()
	log := `{"seq":1,"kind":"effect","intent":"a","id":"e-1","digest":"x","at":"2026-01-01T00:00:00Z"}
{"seq":2,"kind":"accepted","intent":"b","job":"j-1","at":"2026-01-01T00:00:00Z"}
{"seq":3,"kind":"eff`
	recs, err := ReadLog(strings.NewReader(log))
	require.NoError(t, err, "a torn last line is ignored")
	require.Len(t, recs, 2)
	require.Equal(t, "e-1", recs[0].ID)
	require.Equal(t, "j-1", recs[1].Job)

	_, err = ReadLog(strings.NewReader("garbage\n" + `{"seq":1,"kind":"effect","intent":"a"}` + "\n"))
	require.ErrorContains(t, err, "line 1")
}
