package demo

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	lctools "github.com/tmc/langchaingo/tools"

	"github.com/toolfence/toolfence/examples/scripted"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
	"github.com/toolfence/toolfence/tools"
)

// successorRun is the successor agent's side of the story: the tools it is given report
// what they answered to the timeline.
type successorRun struct {
	ic  *interceptor.Interceptor
	api *PaymentAPI
	rep *Report

	// What the story needs to have happened, in order; set by the watching tools, which
	// the executor calls one at a time.
	unknown, reconciled, replayed bool
	// extra is set when a charge of the successor reached the API.
	extra error
}

// successor plays the successor run in this process, on the ledger the dead worker left: a
// langchaingo OpenAIFunctionsAgent, with a scripted policy as its model, over the guarded
// charge, toolfence's reconcile tool and a wait tool.
func successor(ctx context.Context, cfg Options, store string, api *PaymentAPI, rep *Report) error {
	l, err := openLedger(ctx, store)
	if err != nil {
		return fmt.Errorf("demo: opening the store after the kill: %w", err)
	}
	defer l.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	holder := fmt.Sprintf("demo-successor/pid-%d", os.Getpid())
	ic, err := interceptor.New(l, interceptor.Options{
		Namespace: cfg.Namespace,
		Holder:    holder,
		LeaseTTL:  cfg.LeaseTTL,
		Operations: map[string]interceptor.Operation{
			Operation: {Probe: ChargeProbe(&http.Client{Transport: tr, Timeout: 10 * time.Second}, api.URL)},
		},
	})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	s := &successorRun{ic: ic, api: api, rep: rep}
	agentTools := []lctools.Tool{
		watchCharge{inner: GuardedCharge(ic, tr, api.URL), s: s},
		watchReconcile{inner: tools.Reconciler(ic), s: s},
		waitTool{},
	}
	rep.step("successor", "successor %s takes over task %s: a new OpenAIFunctionsAgent (scripted offline model) with the guarded %s, %s and %s tools",
		holder, cfg.Task, Operation, tools.ReconcileToolName, WaitToolName)

	rctx, cancel := context.WithTimeout(interceptor.WithTask(ctx, cfg.Task), cfg.Timeout)
	defer cancel()
	answer, err := scripted.RunAgent(rctx, successorPolicy(func(string, ...any) {}), agentTools, Input, maxTurns)
	switch {
	case s.extra != nil:
		return s.extra
	case err != nil:
		return fmt.Errorf("demo: the successor agent: %w", err)
	case !s.unknown || !s.reconciled || !s.replayed:
		return fmt.Errorf("%w: unknown outcome seen %t, reconciled %t, replayed %t; it answered %q",
			errOffStory, s.unknown, s.reconciled, s.replayed, answer)
	}
	rep.Answer = answer
	rep.step("answer", "the successor agent answers: %s", answer)
	return nil
}

// current reads the residual of the story's key and its current attempt.
func (s *successorRun) current(ctx context.Context) (*residual.Residual, *residual.Attempt, error) {
	r, err := s.ic.Ledger().Get(ctx, ledger.GetParams{Namespace: s.ic.Namespace(), Key: s.rep.Key})
	if err != nil {
		return nil, nil, fmt.Errorf("demo: reading %s: %w", s.rep.Key, err)
	}
	a := r.Current()
	if a == nil {
		return nil, nil, fmt.Errorf("demo: %s has no attempt", s.rep.Key)
	}
	return r, a, nil
}

// watchCharge is the guarded charge as the successor's agent calls it; it tells the
// timeline what the agent was told.
type watchCharge struct {
	inner lctools.Tool
	s     *successorRun
}

func (w watchCharge) Name() string        { return w.inner.Name() }
func (w watchCharge) Description() string { return w.inner.Description() }

func (w watchCharge) Call(ctx context.Context, input string) (string, error) {
	s := w.s
	before := s.api.Count()
	answer, err := w.inner.Call(ctx, input)
	if err != nil {
		return answer, err
	}
	switch {
	case strings.HasPrefix(answer, seenInProgress):
		_, a, err := s.current(ctx)
		if err != nil {
			return "", err
		}
		wait := "after its lease expires"
		if m := checkAgainIn.FindStringSubmatch(answer); m != nil {
			if d, err := time.ParseDuration(m[1]); err == nil {
				wait = fmt.Sprintf("after %d ms", d.Milliseconds())
			}
		}
		s.rep.step("in_progress", "the agent's %s was refused: attempt %d by %s holds a live lease (token %d); the agent is told to retry %s",
			Operation, a.N, a.Holder, a.Token, wait)
	case strings.HasPrefix(answer, seenUnknown):
		_, a, err := s.current(ctx)
		if err != nil {
			return "", err
		}
		s.unknown = true
		s.rep.step("unknown_outcome", "the agent's %s was refused: attempt %d by %s may have reached the API and nobody recorded the outcome; the agent is told to reconcile first",
			Operation, a.N, a.Holder)
	case strings.HasPrefix(answer, interceptor.ReplayPrefix):
		if n := s.api.Count(); n != before {
			s.extra = fmt.Errorf("demo: the successor's replayed %s reached the API (charges %d → %d)", Operation, before, n)
			return answer, nil
		}
		_, out, _ := strings.Cut(answer, ": ")
		s.replayed = s.reconciled
		s.rep.Replayed = []byte(out)
		s.rep.step("replay", "the agent's %s replayed the recorded result, the API was not called: %s", Operation, out)
	default:
		if n := s.api.Count(); n != before {
			s.extra = fmt.Errorf("demo: the successor's %s reached the API: a second charge (charges %d → %d); the tool answered %q", Operation, before, n, answer)
		}
	}
	return answer, nil
}

// watchReconcile is toolfence's reconcile tool as the successor's agent calls it; it tells
// the timeline what the probe settled.
type watchReconcile struct {
	inner lctools.Tool
	s     *successorRun
}

func (w watchReconcile) Name() string        { return w.inner.Name() }
func (w watchReconcile) Description() string { return w.inner.Description() }

func (w watchReconcile) Call(ctx context.Context, input string) (string, error) {
	s := w.s
	answer, err := w.inner.Call(ctx, input)
	if err != nil || !strings.HasPrefix(answer, seenSettled) {
		return answer, err
	}
	r, _, err := s.current(ctx)
	if err != nil {
		return "", err
	}
	if len(r.Resolutions) == 0 {
		return answer, nil
	}
	res := r.Resolutions[len(r.Resolutions)-1]
	s.reconciled = s.unknown && r.State == residual.Succeeded
	s.rep.step("reconcile", "the agent called %s: the probe asked the API by Idempotency-Key (%s); residual %s → %s under fencing token %d",
		tools.ReconcileToolName, res.Evidence, res.From, res.To, res.Token)
	return answer, nil
}
