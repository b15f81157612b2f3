package residual_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/residual"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// pendingAt returns a pending residual whose only attempt holds a lease until expires.
func pendingAt(expires time.Time) *residual.Residual {
	return &residual.Residual{
		Key:   residual.Key("ns", "task", "op", "target"),
		State: residual.Pending,
		Attempts: []residual.Attempt{{
			N: 1, Holder: "agent-a", Token: 1, LeaseExpires: expires, Started: t0,
			RequestDigest: "d1",
		}},
		Token: 1,
	}
}

func TestEffectiveStatePending(t *testing.T) {
	t.Parallel()
	expires := t0.Add(10 * time.Second)
	r := pendingAt(expires)

	tests := []struct {
		name string
		now  time.Time
		want residual.State
	}{
		{"well before expiry", t0, residual.Pending},
		{"1ns before expiry", expires.Add(-time.Nanosecond), residual.Pending},
		{"exactly at expiry", expires, residual.Unknown},
		{"1ns after expiry", expires.Add(time.Nanosecond), residual.Unknown},
		{"long after expiry", expires.Add(time.Hour), residual.Unknown},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, r.EffectiveState(tt.now), tt.name)
		require.Equal(t, tt.want == residual.Pending, r.LeaseLive(tt.now), tt.name)
	}
	// EffectiveState is a read: the stored state is untouched.
	require.Equal(t, residual.Pending, r.State)
}

func TestEffectiveStateReleasedPendingIsUnknown(t *testing.T) {
	t.Parallel()
	r := pendingAt(t0.Add(time.Hour))
	r.Attempts[0].Released = true
	require.False(t, r.LeaseLive(t0))
	require.Equal(t, residual.Unknown, r.EffectiveState(t0), "a pending residual without a live lease may have reached upstream")
}

func TestEffectiveStatePendingWithOutcomeIsUnknown(t *testing.T) {
	t.Parallel()
	// The current attempt carries an outcome but the record still says pending (a torn
	// write): nobody holds a live lease on it any more.
	r := pendingAt(t0.Add(time.Hour))
	r.Attempts[0].Outcome = residual.Succeeded
	require.False(t, r.LeaseLive(t0))
	require.Equal(t, residual.Unknown, r.EffectiveState(t0))
}

func TestEffectiveStatePendingWithoutAttemptsIsUnknown(t *testing.T) {
	t.Parallel()
	r := &residual.Residual{State: residual.Pending}
	require.False(t, r.LeaseLive(t0))
	require.Equal(t, residual.Unknown, r.EffectiveState(t0))
}

func TestEffectiveStateLatestAttemptDecides(t *testing.T) {
	t.Parallel()
	r := pendingAt(t0.Add(time.Second)) // first attempt's lease is long gone at now
	r.Attempts[0].Outcome = residual.Failed
	r.Attempts[0].Released = true
	r.Attempts = append(r.Attempts, residual.Attempt{
		N: 2, Holder: "agent-b", Token: 2, LeaseExpires: t0.Add(time.Hour), Started: t0,
	})
	now := t0.Add(time.Minute)
	require.Equal(t, residual.Pending, r.EffectiveState(now))
	require.Equal(t, 2, r.Current().N)
}

func TestEffectiveStateNonPendingUnaffectedByLease(t *testing.T) {
	t.Parallel()
	for _, s := range []residual.State{residual.Unknown, residual.Accepted, residual.Succeeded, residual.Failed} {
		r := pendingAt(t0.Add(time.Second))
		r.State = s
		r.Attempts[0].Outcome = s
		r.Attempts[0].Released = true
		require.Equal(t, s, r.EffectiveState(t0), "%s before expiry", s)
		require.Equal(t, s, r.EffectiveState(t0.Add(time.Hour)), "%s after expiry", s)
	}
	// A live, unreleased lease does not change a settled state either.
	r := pendingAt(t0.Add(time.Hour))
	r.State = residual.Succeeded
	require.Equal(t, residual.Succeeded, r.EffectiveState(t0))
}

func TestCurrent(t *testing.T) {
	t.Parallel()
	var nilR *residual.Residual
	require.Nil(t, nilR.Current())
	require.Nil(t, (&residual.Residual{}).Current())
	require.Nil(t, (&residual.Residual{Attempts: []residual.Attempt{}}).Current())

	r := pendingAt(t0)
	r.Attempts = append(r.Attempts, residual.Attempt{N: 2, Token: 5})
	c := r.Current()
	require.NotNil(t, c)
	require.Equal(t, 2, c.N)
	// Current points into the record, so the holder of a copy can update the attempt.
	c.Released = true
	require.True(t, r.Attempts[1].Released)
}

func fullResidual() *residual.Residual {
	return &residual.Residual{
		Key: residual.Key("ns", "task", "op", "target"), Namespace: "ns", Task: "task",
		Operation: "op", Target: "target", State: residual.Succeeded, RequestDigest: "req",
		Attempts: []residual.Attempt{
			{N: 1, Holder: "a", Token: 1, LeaseExpires: t0, Started: t0, Outcome: residual.Unknown, Released: true},
			{N: 2, Holder: "b", Token: 3, LeaseExpires: t0, Started: t0, Ended: t0, Outcome: residual.Succeeded},
		},
		Result:       []byte(`{"id":"ch_1"}`),
		ResultDigest: "resdigest",
		Handle:       "https://upstream/jobs/1",
		Evidence: []residual.Evidence{{
			At: t0, Holder: "a", Token: 1, Outcome: residual.Succeeded, ResponseDigest: "rd",
			Result: []byte(`{"late":true}`), Handle: "h", Note: "fenced out",
		}},
		Resolutions: []residual.Resolution{{At: t0, By: "op", Token: 2, From: residual.Unknown, To: residual.Failed, Note: "n"}},
		Token:       3, CreatedAt: t0, UpdatedAt: t0,
	}
}

func TestCloneNil(t *testing.T) {
	t.Parallel()
	var r *residual.Residual
	require.Nil(t, r.Clone())
}

func TestCloneEqual(t *testing.T) {
	t.Parallel()
	r := fullResidual()
	c := r.Clone()
	require.NotSame(t, r, c)
	require.Equal(t, r, c)
	want, err := json.Marshal(r)
	require.NoError(t, err)
	got, err := json.Marshal(c)
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(got))
}

func TestCloneIsDeep(t *testing.T) {
	t.Parallel()
	r := fullResidual()
	orig := fullResidual()
	c := r.Clone()

	c.State = residual.Failed
	c.Attempts[0].Holder = "mutated"
	c.Attempts[1].Released = true
	c.Attempts = append(c.Attempts, residual.Attempt{N: 3})
	c.Result[0] = 'X'
	c.Evidence[0].Note = "mutated"
	c.Evidence = append(c.Evidence, residual.Evidence{Note: "extra"})
	c.Resolutions[0].By = "mutated"
	c.Resolutions = append(c.Resolutions, residual.Resolution{By: "extra"})
	c.Current().Token = 99

	require.Equal(t, orig, r, "mutating the clone changed the original")
}

// TestCloneCopiesEvidenceResult: Evidence carries its own Result bytes; a deep copy must not
// share them with the original.
func TestCloneCopiesEvidenceResult(t *testing.T) {
	t.Parallel()
	r := fullResidual()
	c := r.Clone()
	c.Evidence[0].Result[0] = 'X'
	require.Equal(t, `{"late":true}`, string(r.Evidence[0].Result), "Clone shares Evidence[].Result with the original")
}

func TestCloneAppendDoesNotAlias(t *testing.T) {
	t.Parallel()
	// Spare capacity in the original's slices must not be shared: appending to the clone
	// must not write into the original's backing arrays.
	r := fullResidual()
	r.Attempts = make([]residual.Attempt, 1, 8)
	r.Attempts[0] = residual.Attempt{N: 1}
	c := r.Clone()
	c.Attempts = append(c.Attempts, residual.Attempt{N: 2})
	r.Attempts = append(r.Attempts, residual.Attempt{N: 20})
	require.Equal(t, 2, c.Attempts[1].N)
	require.Equal(t, 20, r.Attempts[1].N)
}
