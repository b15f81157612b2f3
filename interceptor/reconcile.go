package interceptor

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// Probe asks upstream what became of the attempt recorded in r (looking it up by r.Key,
// which the tool sent as Idempotency-Key, or by r.Handle). It returns Succeeded or Failed
// when upstream knows, and Accepted or Unknown (or an error) when it does not yet. On a key
// whose earlier intent succeeded and was superseded (BeginOptions.Supersede: an earlier
// attempt of r ended Succeeded, or a resolution settled it so), what upstream holds under
// r.Key may be that intent's effect: the probe must answer about r.Current() only.
type Probe func(ctx context.Context, r *residual.Residual) (ProbeResult, error)

// ProbeResult is what a probe learned.
type ProbeResult struct {
	// Outcome: Succeeded or Failed settle the residual; anything else leaves it open.
	Outcome residual.State
	// Result is cached when the residual is settled as succeeded.
	Result []byte
	// Evidence says what upstream answered, for the audit.
	Evidence string
}

// ReconcileParams select what Reconcile looks at. With Key set only that residual is
// probed; otherwise every open residual of the namespace matching Task and Operation.
type ReconcileParams struct {
	Key       string
	Task      string
	Operation string
	// By names the reconciler in the audit. Defaults to "reconciler:" + the holder.
	By string
}

// ReconcileReport says what Reconcile settled and what it left open. Every surface
// (Go, MCP's reconcile tool) reports in this shape; both lists are non-nil. MCP hosts
// read them as "resolved" and "open".
type ReconcileReport struct {
	Settled   []Settled   `json:"resolved"`
	Unsettled []Unsettled `json:"open"`
}

// Settled is one residual a probe settled.
type Settled struct {
	Key      string         `json:"key"`
	From     residual.State `json:"from"`
	To       residual.State `json:"to"`
	Token    uint64         `json:"token"`
	Evidence string         `json:"evidence,omitempty"`
}

// Unsettled is one residual left open, with the reason.
type Unsettled struct {
	Key    string         `json:"key"`
	State  residual.State `json:"state"`
	Reason string         `json:"reason"`
}

// Reconcile settles unknown and accepted residuals through the probes registered for their
// operations: a probe that answers Succeeded or Failed resolves the residual (under a new
// fencing token, so a zombie holder's late commit is refused); everything else is listed as
// open with the reason. Pending residuals under a live lease are left alone. It returns an
// error only when the ledger cannot be read; probe errors are reported per residual.
//
// Reconcile makes the span "toolfence.reconcile" (each resolution a child span) and counts
// every residual it looked at in toolfence.reconcile.residuals.
func (ic *Interceptor) Reconcile(ctx context.Context, p ReconcileParams) (*ReconcileReport, error) {
	ctx, span := ic.tel.start(ctx, "toolfence.reconcile")
	defer span.End()
	rep, err := ic.reconcile(ctx, p)
	if err != nil {
		spanError(ctx, err)
		return nil, err
	}
	for _, s := range rep.Settled {
		ic.tel.reconciledOne(ctx, s.To.String())
	}
	for range rep.Unsettled {
		ic.tel.reconciledOne(ctx, "open")
	}
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("toolfence.reconcile.resolved", len(rep.Settled)), attribute.Int("toolfence.reconcile.open", len(rep.Unsettled)))
	}
	return rep, nil
}

func (ic *Interceptor) reconcile(ctx context.Context, p ReconcileParams) (*ReconcileReport, error) {
	by := p.By
	if by == "" {
		by = "reconciler:" + ic.cfg.Holder
	}
	var todo []*residual.Residual
	if p.Key != "" {
		r, err := ic.ledger.Get(ctx, ledger.GetParams{Namespace: ic.cfg.Namespace, Key: p.Key})
		if err != nil {
			return nil, err
		}
		todo = append(todo, r)
	} else {
		cursor := ""
		for {
			page, err := ic.ledger.List(ctx, ledger.ListParams{
				Namespace: ic.cfg.Namespace, Task: p.Task, Operation: p.Operation, Cursor: cursor,
				States: []residual.State{residual.Pending, residual.Unknown, residual.Accepted},
			})
			if err != nil {
				return nil, err
			}
			todo = append(todo, page.Residuals...)
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
	}
	rep := &ReconcileReport{Settled: []Settled{}, Unsettled: []Unsettled{}}
	for _, r := range todo {
		s, u := ic.reconcileOne(ctx, r, by)
		if s != nil {
			rep.Settled = append(rep.Settled, *s)
		} else {
			rep.Unsettled = append(rep.Unsettled, *u)
		}
	}
	return rep, nil
}

func (ic *Interceptor) reconcileOne(ctx context.Context, r *residual.Residual, by string) (*Settled, *Unsettled) {
	open := func(reason string) (*Settled, *Unsettled) {
		return nil, &Unsettled{Key: r.Key, State: r.State, Reason: reason}
	}
	switch r.State {
	case residual.Unknown, residual.Accepted:
	case residual.Pending:
		return open("in progress under a live lease")
	default:
		return open("already " + r.State.String())
	}
	probe := ic.operation(r.Operation).Probe
	if probe == nil {
		return open(fmt.Sprintf("no probe registered for operation %q: resolve it by hand", r.Operation))
	}
	pr, err := safeProbe(ctx, probe, r)
	if err != nil {
		return open("probe failed: " + err.Error())
	}
	if !pr.Outcome.Terminal() {
		return open(fmt.Sprintf("probe says %s: %s", pr.Outcome, pr.Evidence))
	}
	stored, err := ic.Resolve(ctx, ResolveParams{
		Key: r.Key, As: pr.Outcome, By: by, Note: "settled by probe", Evidence: pr.Evidence, Result: pr.Result,
		IfToken: r.Token, // what the probe found is about this attempt, not a later one
	})
	if err != nil {
		return open("resolve failed: " + err.Error())
	}
	return &Settled{Key: r.Key, From: r.State, To: stored.State, Token: stored.Token, Evidence: pr.Evidence}, nil
}

func safeProbe(ctx context.Context, probe Probe, r *residual.Residual) (pr ProbeResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = errors.New(fmt.Sprint("probe panicked: ", p))
		}
	}()
	return probe(ctx, r.Clone())
}
