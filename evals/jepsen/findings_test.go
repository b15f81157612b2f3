package jepsen

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFindingsAreCaught re-checks the sub-histories of the bugs the runs found (one key
// each, from docs/reliability.md): each must stay illegal, stuck on the step named.
func TestFindingsAreCaught(t *testing.T) {
	for _, tc := range []struct{ file, stuck, violation string }{
		// badger answers a Commit on a key GC deleted with ErrNotFound alone; the contract
		// (and PostgreSQL) say ErrLeaseLost.
		{"badger-commit-after-gc.jsonl", "commit(e13k2, c44-62, token 10, accepted, margin 20ms) → not_found", ""},
		// PostgreSQL: a retried AppendEvidence took another client's identical observation
		// for its own; one observation was acknowledged and never stored: no answer read
		// after a write of it explains 9 observations.
		{"postgres-evidence-retry.jsonl", "evidence(e2k1) → ok [failed token 8 holder c6-171 att 3 ev 9 res 0] (its answer", ""},
		// PostgreSQL: a retried AppendEvidence whose first try had landed stored a second
		// copy, because another client's observation came last in between.
		{"postgres-evidence-retry-duplicate.jsonl", "evidence(e58k1) → ok [succeeded token 12 holder c46-445 att 3 ev 13 res 0] (its answer", ""},
		// PostgreSQL: a retried Resolve took another resolver's identical resolution for its
		// own: two callers were told they resolved the key, with the same new token.
		{"postgres-resolve-retry.jsonl", "", "token 11 issued twice on e113k2"},
		// PostgreSQL: a retried Reserve whose first try had acquired token 16 answered
		// in_progress, because by the retry another holder had taken the expired lease.
		{"postgres-reserve-retry.jsonl", "resolve(e95k2, as succeeded, by reconciler-1) → in_progress", ""},
		// PostgreSQL (with the write ids of the ledger merge): a Resolve whose first try
		// landed answered in_progress, because GC had deleted the residual and a new holder
		// had taken the key before the retry looked for its own resolution.
		// PostgreSQL on main (10-minute run, seed 104): a Commit whose first try landed
		// (a reader saw its succeeded token 10) answered lease_lost, because by the retry
		// the residual had been collected and the key taken again (token 12).
		{"postgres-commit-retry-superseded.jsonl", "reserve(e50k1, c39-305, digest a, ttl 150ms, redispatch false) → ok payload_mismatch [succeeded token 10 holder c43-32 att 4 ev 4 res 1]", ""},
		{"postgres-resolve-retry-superseded.jsonl", "reserve(e4k0, c9-309, digest a, ttl 150ms, redispatch false) → ok replay [succeeded token 8 holder c9-305 att 6 ev 8 res 2]", ""},
	} {
		t.Run(tc.file, func(t *testing.T) {
			ops, err := ReadHistory(filepath.Join("testdata", "findings", tc.file))
			require.NoError(t, err)
			v := Check(ops, time.Minute, "")
			require.Equal(t, "Illegal", v.Linearizable)
			var stuck string
			for _, l := range v.Window {
				if strings.HasPrefix(l, "✗") {
					stuck = l
				}
			}
			require.Contains(t, stuck, tc.stuck, "window:\n%s", strings.Join(v.Window, "\n"))
			require.Contains(t, joined(v.Violations), tc.violation)
		})
	}
}

// TestResolveJudgedByItsOwnToken: a Resolve whose retry answered with the residual as
// re-read, after the next holder had reserved the key under token 16 (docs/reliability.md,
// finding 9), issued token 15, not 16: the worker records the token of the Resolve's own
// resolution (Output.Issued, 0 when the key moved on), so the checker no longer reports
// token 16 as issued twice.
func TestResolveJudgedByItsOwnToken(t *testing.T) {
	ops, err := ReadHistory(filepath.Join("testdata", "findings", "postgres-resolve-retry-reread-token.jsonl"))
	require.NoError(t, err)
	v := Check(ops, time.Minute, "")
	require.NotContains(t, joined(v.Violations), "issued twice")
}
