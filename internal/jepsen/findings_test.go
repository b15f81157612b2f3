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
	for _, tc := range []struct{ file, stuck string }{
		// badger answers a Commit on a key GC deleted with ErrNotFound alone; the contract
		// (and PostgreSQL) say ErrLeaseLost.
		{"badger-commit-after-gc.jsonl", "commit(e13k2, c44-62, token 10, accepted, margin 20ms) → not_found"},
		// PostgreSQL: a retried AppendEvidence took another client's identical observation
		// for its own; one observation was acknowledged and never stored.
		{"postgres-evidence-retry.jsonl", "evidence(e2k1) → ok [failed token 8 holder c6-171 att 3 ev 9 res 0]"},
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
		})
	}
}
