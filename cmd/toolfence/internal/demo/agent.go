package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/toolfence/toolfence/examples/scripted"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/tools"
)

// Input is what both agents are asked to do.
const Input = "Charge invoice " + Invoice + ": 42.00 EUR."

// The observations the successor's model reacts to: the first words of what the guarded
// charge and the reconcile tool answer (see package tools).
const (
	seenInProgress = "blocked: another attempt at " + Operation
	seenUnknown    = "blocked: a previous attempt may have reached " + Upstream + "; outcome unknown"
	seenSettled    = "settled: "
	seenWaited     = "waited "
)

// workerScript is the worker's model: charge the invoice, then say so. The worker is
// killed while the first call is in flight, so the second step is never played.
func workerScript(printf func(string, ...any)) *scripted.Model {
	return &scripted.Model{Printf: printf, Steps: []scripted.Step{
		{Think: "Invoice " + Invoice + " needs charging.", Tool: Operation, Args: ChargeArgs},
		{Final: "Charged invoice " + Invoice + "."},
	}}
}

// successorPolicy is the successor's model. It reacts to what the tools answer, the way the
// observations tell an LLM to: wait while another attempt holds the lease, reconcile an
// unknown outcome instead of retrying it, and take a replay as done.
func successorPolicy(printf func(string, ...any)) *scripted.Policy {
	return &scripted.Policy{Printf: printf, MaxTurns: maxTurns, Rules: []scripted.Rule{
		{Think: "Invoice " + Invoice + " still needs charging.", Tool: Operation, Args: ChargeArgs},
		{When: seenInProgress, Think: "Another attempt is still running; I wait as told, then check again.",
			Tool: WaitToolName, ArgsFrom: waitArgs},
		{When: seenWaited, Think: "The other attempt's lease should be over; checking the charge again.", Tool: Operation, Args: ChargeArgs},
		{When: seenUnknown, Think: "A charge may already have gone through; I must not retry blindly. Reconciling.",
			Tool: tools.ReconcileToolName, Args: `{}`},
		{When: seenSettled, Think: "The probe settled the charge; asking again returns the recorded result.", Tool: Operation, Args: ChargeArgs},
		{When: interceptor.ReplayPrefix, Final: "Invoice " + Invoice + " was charged exactly once; the recorded charge was replayed, not repeated."},
	}}
}

// maxTurns bounds the successor's run: a handful of waits while the dead worker's lease
// runs out, then reconcile and replay.
const maxTurns = 24

var checkAgainIn = regexp.MustCompile(`check again in (\d[0-9.]*[a-zµ]+),`)

// waitSlack is added to the wait an in_progress observation asks for, so the lease has
// surely expired when the agent checks again.
const waitSlack = 50 * time.Millisecond

// waitArgs turns "… check again in 1.372s, when its lease expires …" into {"ms": 1422}. An
// observation without a time asks for a short wait.
func waitArgs(answer string) (string, error) {
	d := 100 * time.Millisecond
	if m := checkAgainIn.FindStringSubmatch(answer); m != nil {
		var err error
		if d, err = time.ParseDuration(m[1]); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf(`{"ms":%d}`, (d + waitSlack).Milliseconds()), nil
}

// WaitToolName is the name of the wait tool the successor agent has.
const WaitToolName = "wait"

// maxWait caps one wait of the wait tool.
const maxWait = 30 * time.Second

// waitTool lets the agent wait before it checks again, as the in_progress observation asks.
type waitTool struct{}

func (waitTool) Name() string { return WaitToolName }

func (waitTool) Description() string {
	return fmt.Sprintf(`Waits before the agent continues. Input: {"ms": N}, at most %d.`, maxWait.Milliseconds())
}

// Call waits the given milliseconds, or until ctx ends (an error: the run is over).
func (waitTool) Call(ctx context.Context, input string) (string, error) {
	var in struct {
		MS int64 `json:"ms"`
	}
	if err := json.Unmarshal([]byte(input), &in); err != nil || in.MS < 0 || in.MS > maxWait.Milliseconds() {
		return fmt.Sprintf(`invalid input for %s: want {"ms": 0 to %d}`, WaitToolName, maxWait.Milliseconds()), nil
	}
	t := time.NewTimer(time.Duration(in.MS) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return fmt.Sprintf("%s%d ms", seenWaited, in.MS), nil
	case <-ctx.Done():
		return "", fmt.Errorf("%s: %w", WaitToolName, ctx.Err())
	}
}

// errOffStory is wrapped by the successor's error when its agent did not tell the story.
var errOffStory = errors.New("demo: the successor agent went off the story")
