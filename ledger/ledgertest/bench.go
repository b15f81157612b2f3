package ledgertest

import (
	"testing"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// BenchListFiltered benchmarks one List page per sub-benchmark over namespace ns of l, which
// must hold 20,000 succeeded residuals (tasks task-0 to task-99, so 200 each; operations
// op-0 to op-9; a target each) and exactly one open residual: filters that match nothing,
// the open states alone, and a task's settled residuals (a filter that matches nothing
// must not read the namespace). Every backend's benchmark runs it on its
// own fill.
func BenchListFiltered(b *testing.B, l ledger.Ledger, ns string) {
	open := []residual.State{residual.Pending, residual.Unknown, residual.Accepted}
	for _, c := range []struct {
		name string
		p    ledger.ListParams
		want int
	}{
		{"no-match-task", ledger.ListParams{Namespace: ns, States: open, Task: "no-such-task"}, 0},
		{"no-match-target", ledger.ListParams{Namespace: ns, States: open, Target: "no-such-target"}, 0},
		{"open-among-settled", ledger.ListParams{Namespace: ns, States: open}, 1},
		{"task-settled-page", ledger.ListParams{Namespace: ns, Task: "task-7", Limit: 100}, 100},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				page, err := l.List(b.Context(), c.p)
				if err != nil || len(page.Residuals) != c.want {
					b.Fatalf("list: %v, %d residuals, want %d", err, len(page.Residuals), c.want)
				}
			}
		})
	}
}
