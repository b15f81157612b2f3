// Command webhooks is the accepted-is-not-done story: the webhook API answers 202, so the
// residual is accepted and the agent is told to wait (a retry is refused, nothing is sent
// twice); a later probe of the job's Location promotes it to succeeded, and the next run
// replays the recorded delivery.
//
// It runs offline: a scripted model, a fake webhook API on 127.0.0.1 and the embedded badger
// ledger in a temporary directory. It exits non-zero if the webhook API's counts are wrong.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	lctools "github.com/tmc/langchaingo/tools"

	"github.com/toolfence/toolfence/examples/scripted"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
	"github.com/toolfence/toolfence/tools"
)

const (
	task  = "order-7731-fulfilment"
	input = "Tell the shop's webhook that order 7731 shipped (event evt_7731_shipped)."
	args  = `{"event_id":"evt_7731_shipped","type":"order.shipped","order_id":"7731"}`
)

// FireInput is what the model sends; the event is the target.
type FireInput struct {
	EventID string `json:"event_id" toolfence:"target"`
	Type    string `json:"type" jsonschema:"enum=order.shipped,enum=order.cancelled"`
	OrderID string `json:"order_id"`
}

var client = &http.Client{Transport: &tools.Transport{}, Timeout: 30 * time.Second}

func main() {
	if err := story(); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
}

func fireTool(api string) (*tools.Typed[FireInput, Job], error) {
	return tools.New("fire_webhook", "Deliver an event to the shop's webhook endpoint.",
		func(ctx context.Context, in FireInput) (Job, error) {
			body, _ := json.Marshal(in)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, api+"/deliveries", bytes.NewReader(body))
			if err != nil {
				return Job{}, err
			}
			resp, err := client.Do(req)
			if err != nil {
				return Job{}, err
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode >= 300 {
				return Job{}, fmt.Errorf("webhook API answered %s: %s", resp.Status, raw)
			}
			var j Job
			return j, json.Unmarshal(raw, &j)
		}, tools.WithUpstreamName("the webhook API"))
}

// probe polls the accepted call's handle (the 202's Location).
func probe(ctx context.Context, r *residual.Residual) (interceptor.ProbeResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.Handle, nil)
	if err != nil {
		return interceptor.ProbeResult{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return interceptor.ProbeResult{}, err
	}
	defer resp.Body.Close()
	var j Job
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&j) != nil {
		return interceptor.ProbeResult{Outcome: residual.Unknown, Evidence: "job status answered " + resp.Status}, nil
	}
	out, _ := json.Marshal(j)
	switch j.Status {
	case "delivered":
		return interceptor.ProbeResult{Outcome: residual.Succeeded, Result: out, Evidence: j.JobID + " delivered"}, nil
	case "failed":
		return interceptor.ProbeResult{Outcome: residual.Failed, Evidence: j.JobID + " failed"}, nil
	}
	return interceptor.ProbeResult{Outcome: residual.Accepted, Evidence: j.JobID + " is " + j.Status}, nil
}

func story() error {
	dir, err := os.MkdirTemp("", "toolfence-webhooks-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	api := newWebhookAPI()
	srv := httptest.NewServer(api)
	defer srv.Close()

	led, err := badger.Open(dir, badger.Options{})
	if err != nil {
		return err
	}
	defer led.Close()
	ic, err := interceptor.New(led, interceptor.Options{Holder: "shop-agent"})
	if err != nil {
		return err
	}
	if err := ic.Register("fire_webhook", interceptor.Operation{Probe: probe}); err != nil {
		return err
	}
	fire, err := fireTool(srv.URL)
	if err != nil {
		return err
	}
	agentTools := []lctools.Tool{fire.Tool(ic)}
	fmt.Printf("the model sees the tool as %s: %s\n", fire.Name(), fire.Description())
	ctx := interceptor.WithTask(context.Background(), task)

	fmt.Println("== run 1: the webhook API queues the delivery (202)")
	model := &scripted.Model{Steps: []scripted.Step{
		{Tool: "fire_webhook", Args: args},
		{Expect: "accepted: the webhook API accepted the request and is still working on it",
			Think: "Not confirmed yet. Let me fire it again to be sure.", Tool: "fire_webhook", Args: args},
		{Expect: "accepted: the webhook API accepted the request and is still working on it",
			Final: "The shipping event is queued at the webhook API; I will wait for it rather than send it twice."},
	}}
	if _, err := scripted.Run(ctx, model, agentTools, input); err != nil {
		return fmt.Errorf("run 1: %w", err)
	}

	fmt.Println("== the reconciler probes the job")
	if err := reconcile(ctx, ic); err != nil {
		return err
	}
	fmt.Println("webhook API: the worker delivers the queued job")
	api.deliverAll()
	if err := reconcile(ctx, ic); err != nil {
		return err
	}

	fmt.Println("== run 2: the agent checks on the event")
	model = &scripted.Model{Steps: []scripted.Step{
		{Tool: "fire_webhook", Args: args},
		{Expect: interceptor.ReplayPrefix + "already done, outcome recorded at ", Final: "Order 7731's shipping event was delivered once."},
	}}
	answer, err := scripted.Run(ctx, model, agentTools, input)
	if err != nil {
		return fmt.Errorf("run 2: %w", err)
	}
	fmt.Println("run 2 finished:", answer)

	deliveries, polls := api.counts()
	fmt.Printf("upstream counts: deliveries=%d polls=%d\n", deliveries, polls)
	if deliveries != 1 || polls != 2 {
		return fmt.Errorf("want deliveries=1 polls=2")
	}
	fmt.Println("OK: one delivery, recorded as succeeded only once the API confirmed it")
	return nil
}

func reconcile(ctx context.Context, ic *interceptor.Interceptor) error {
	task, _ := interceptor.TaskFrom(ctx)
	rep, err := ic.Reconcile(ctx, interceptor.ReconcileParams{Task: task})
	if err != nil {
		return err
	}
	for _, s := range rep.Settled {
		fmt.Printf("reconciler: %s %s → %s (%s)\n", s.Key[:12]+"…", s.From, s.To, s.Evidence)
	}
	for _, u := range rep.Unsettled {
		fmt.Printf("reconciler: %s still %s: %s\n", u.Key[:12]+"…", u.State, u.Reason)
	}
	return nil
}
