package rules_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/rules"
	"github.com/toolfence/toolfence/residual"
)

// Refused commits cannot grow a residual without bound: at most MaxEvidence observations
// are kept, and large results keep only their digest.
func TestEvidenceIsBounded(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	key := residual.Key("ns", "task", "op", "target")
	_, r, _ := rules.ApplyReserve(nil, ledger.ReserveParams{
		Namespace: "ns", Key: key, Task: "task", Operation: "op", Target: "target",
		Holder: "a", RequestDigest: "d", TTL: time.Second,
	}, 1, now)
	big := bytes.Repeat([]byte("x"), rules.MaxEvidenceResult+1)
	for i := range rules.MaxEvidence + 10 {
		_, err := rules.ApplyCommit(r, ledger.CommitParams{
			Namespace: "ns", Key: key, Holder: "zombie", Token: 7, Outcome: residual.Succeeded,
			Result: big, ResponseDigest: "digest",
		}, now.Add(time.Duration(i)*time.Millisecond))
		require.ErrorIs(t, err, residual.ErrLeaseLost)
	}
	require.Len(t, r.Evidence, rules.MaxEvidence)
	require.Nil(t, r.Evidence[0].Result, "an oversized result is dropped")
	require.Equal(t, "digest", r.Evidence[0].ResponseDigest, "its digest is kept")
	require.Contains(t, r.Evidence[0].Note, "result omitted")
	require.Equal(t, residual.Pending, r.State, "refused commits never change the state")

	rules.ApplyEvidence(r, residual.Evidence{Holder: "x", Note: "one more"}, now)
	require.Len(t, r.Evidence, rules.MaxEvidence)
}
