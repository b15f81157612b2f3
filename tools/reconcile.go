package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	lctools "github.com/tmc/langchaingo/tools"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// ReconcileToolName is the name of the tool Reconciler returns.
const ReconcileToolName = "toolfence_reconcile"

// Reconciler returns a langchaingo tool that lets an agent settle what its guarded tools left
// open: it runs ic.Reconcile for the task in the call's context (or for one key, given as
// {"key": "tf1_…"} or as the bare key; a key of another task is refused) and answers in plain language what the registered
// probes settled and what is still open. Refusals (no task, a ledger error) are observations
// with a nil error, like Guard's.
func Reconciler(ic *interceptor.Interceptor) lctools.Tool { return reconciler{ic: ic} }

type reconciler struct{ ic *interceptor.Interceptor }

func (reconciler) Name() string { return ReconcileToolName }

func (reconciler) Description() string {
	return "Asks the upstream APIs what became of earlier tool calls whose outcome is unknown or pending " +
		"upstream, and records the answer. Input: {} for every open call of this task, or {\"key\": \"tf1_…\"}."
}

func (r reconciler) Call(ctx context.Context, input string) (string, error) {
	task, ok := interceptor.TaskFrom(ctx)
	if !ok {
		return "toolfence: no task in the context, so nothing was reconciled", nil
	}
	p := interceptor.ReconcileParams{Task: task}
	input = strings.TrimSpace(input)
	var in struct {
		Key string `json:"key"`
	}
	switch {
	case strings.HasPrefix(input, residual.KeyPrefix):
		p.Key = input
	case input != "" && json.Unmarshal([]byte(input), &in) == nil:
		p.Key = in.Key
	}
	if p.Key != "" {
		res, err := r.ic.Ledger().Get(ctx, ledger.GetParams{Namespace: r.ic.Namespace(), Key: p.Key})
		switch {
		case errors.Is(err, residual.ErrNotFound):
			return fmt.Sprintf("nothing to reconcile: toolfence has no call with key %s", p.Key), nil
		case err != nil:
			return fmt.Sprintf("toolfence: reconciling failed, nothing was settled: %v", err), nil
		case res.Task != task:
			return fmt.Sprintf("refused: key %s belongs to another task; nothing was reconciled", p.Key), nil
		}
		p.Task = ""
	}
	rep, err := r.ic.Reconcile(ctx, p)
	if err != nil {
		return fmt.Sprintf("toolfence: reconciling failed, nothing was settled: %v", err), nil
	}
	if len(rep.Settled) == 0 && len(rep.Unsettled) == 0 {
		return "nothing to reconcile: no call of this task is open", nil
	}
	var b strings.Builder
	for _, s := range rep.Settled {
		fmt.Fprintf(&b, "settled: %s was %s and is now %s", s.Key, s.From, s.To)
		if s.Evidence != "" {
			fmt.Fprintf(&b, " (%s)", s.Evidence)
		}
		b.WriteString("; ")
	}
	for _, u := range rep.Unsettled {
		fmt.Fprintf(&b, "still open: %s is %s: %s; ", u.Key, u.State, u.Reason)
	}
	if len(rep.Settled) > 0 {
		b.WriteString("a call settled as succeeded now replays its result; one settled as failed may be retried")
	} else {
		b.WriteString("do not retry the open calls; wait and reconcile again, or ask a person")
	}
	return b.String(), nil
}
