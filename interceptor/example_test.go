package interceptor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

// openExampleStore opens an embedded ledger in a fresh directory; close removes it.
func openExampleStore() (store *badger.Ledger, closeFn func()) {
	dir, err := os.MkdirTemp("", "toolfence-example-")
	if err != nil {
		log.Fatal(err)
	}
	store, err = badger.Open(dir, badger.Options{})
	if err != nil {
		log.Fatal(err)
	}
	return store, func() {
		_ = store.Close()
		_ = os.RemoveAll(dir)
	}
}

// Guard one side-effecting tool call: the charge runs once, under a lease and a fencing
// token, and its outcome is recorded before Do returns.
func ExampleInterceptor_Do() {
	store, closeStore := openExampleStore()
	defer closeStore()
	ic, err := interceptor.New(store, interceptor.Options{Holder: "agent-1"})
	if err != nil {
		log.Fatal(err)
	}

	ctx := interceptor.WithTask(context.Background(), "run-42")
	call := interceptor.Call{
		Operation: "payments.charge",
		Target:    "invoice:INV-42",
		Args:      json.RawMessage(`{"amount":1200,"currency":"eur"}`),
	}
	res, err := ic.Do(ctx, call, func(ctx context.Context, d interceptor.Dispatch) (interceptor.Response, error) {
		// A real tool sends d.Key upstream as its Idempotency-Key and honours ctx.
		return interceptor.Response{Status: 201, Body: []byte(`{"charge":"ch_1"}`)}, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s replayed=%t attempt=%d token=%d state=%s\n", res.Output, res.Replayed, res.Attempt, res.Token, res.State)
	// Output:
	// {"charge":"ch_1"} replayed=false attempt=1 token=1 state=succeeded
}

// A retried call replays the recorded result instead of charging again, even when the
// arguments are re-serialised; different arguments are refused.
func Example_replay() {
	store, closeStore := openExampleStore()
	defer closeStore()
	ic, err := interceptor.New(store, interceptor.Options{Holder: "agent-1"})
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	chargeTool := func(ctx context.Context, d interceptor.Dispatch) (interceptor.Response, error) {
		charges++
		return interceptor.Response{Status: 200, Body: []byte(fmt.Sprintf(`{"charge":"ch_%d"}`, charges))}, nil
	}
	ctx := interceptor.WithTask(context.Background(), "run-42")
	for _, args := range []string{
		`{"amount":1200,"currency":"eur"}`,
		`{ "currency": "eur", "amount": 1200.0 }`, // the same intent, re-serialised
	} {
		res, err := ic.Do(ctx, interceptor.Call{Operation: "payments.charge", Target: "invoice:INV-42", Args: json.RawMessage(args)}, chargeTool)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s replayed=%t\n", res.Output, res.Replayed)
	}
	_, err = ic.Do(ctx, interceptor.Call{Operation: "payments.charge", Target: "invoice:INV-42", Args: json.RawMessage(`{"amount":9900,"currency":"eur"}`)}, chargeTool)
	fmt.Println("other amount refused:", errors.Is(err, residual.ErrPayloadMismatch))
	fmt.Println("charges:", charges)
	// Output:
	// {"charge":"ch_1"} replayed=false
	// {"charge":"ch_1"} replayed=true
	// other amount refused: true
	// charges: 1
}

// A call that times out may have reached upstream: its outcome is unknown, and the key
// blocks every retry until it is reconciled, instead of charging twice.
func Example_unknownOutcome() {
	store, closeStore := openExampleStore()
	defer closeStore()
	ic, err := interceptor.New(store, interceptor.Options{Holder: "agent-1"})
	if err != nil {
		log.Fatal(err)
	}
	calls := 0
	timesOut := func(ctx context.Context, d interceptor.Dispatch) (interceptor.Response, error) {
		calls++
		return interceptor.Response{}, errors.New("read tcp: i/o timeout")
	}
	ctx := interceptor.WithTask(context.Background(), "run-42")
	call := interceptor.Call{Operation: "payments.charge", Target: "invoice:INV-42", Args: json.RawMessage(`{"amount":1200}`)}
	for range 2 {
		_, err := ic.Do(ctx, call, timesOut)
		var v *interceptor.Violation
		if errors.As(err, &v) {
			fmt.Printf("%s: state=%s attempt=%d unknown=%t\n", v.Kind, v.State, v.Attempt, errors.Is(err, residual.ErrUnknownOutcome))
		}
	}
	fmt.Println("tool calls:", calls)
	// Output:
	// unknown_outcome: state=unknown attempt=1 unknown=true
	// unknown_outcome: state=unknown attempt=1 unknown=true
	// tool calls: 1
}

// A probe asks upstream what became of an unknown call; the reconciler settles the
// residual, and the retry replays what upstream reported instead of charging again.
func Example_reconcile() {
	store, closeStore := openExampleStore()
	defer closeStore()
	api := map[string]string{} // the payment API's charges by idempotency key
	ic, err := interceptor.New(store, interceptor.Options{
		Holder: "agent-1",
		Operations: map[string]interceptor.Operation{
			"payments.charge": {Probe: func(ctx context.Context, r *residual.Residual) (interceptor.ProbeResult, error) {
				if ch, ok := api[r.Key]; ok {
					return interceptor.ProbeResult{Outcome: residual.Succeeded, Result: []byte(`{"charge":"` + ch + `"}`), Evidence: "found " + ch}, nil
				}
				return interceptor.ProbeResult{Outcome: residual.Failed, Evidence: "no charge"}, nil
			}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := interceptor.WithTask(context.Background(), "run-42")
	call := interceptor.Call{Operation: "payments.charge", Target: "invoice:INV-42", Args: json.RawMessage(`{"amount":1200}`)}

	// The charge reaches the API, but the answer is lost on the way back.
	_, err = ic.Do(ctx, call, func(ctx context.Context, d interceptor.Dispatch) (interceptor.Response, error) {
		api[d.Key] = "ch_1"
		return interceptor.Response{}, errors.New("connection reset by peer")
	})
	fmt.Println("first call unknown:", errors.Is(err, residual.ErrUnknownOutcome))

	rep, err := ic.Reconcile(ctx, interceptor.ReconcileParams{})
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range rep.Settled {
		fmt.Printf("resolved %s -> %s (%s), token %d\n", s.From, s.To, s.Evidence, s.Token)
	}

	res, err := ic.Do(ctx, call, func(ctx context.Context, d interceptor.Dispatch) (interceptor.Response, error) {
		api[d.Key+"-dup"] = "ch_2"
		return interceptor.Response{Status: 200, Body: []byte(`{"charge":"ch_2"}`)}, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("retry: %s replayed=%t\n", res.Output, res.Replayed)
	fmt.Println("charges at the API:", len(api))
	// Output:
	// first call unknown: true
	// resolved unknown -> succeeded (found ch_1), token 2
	// retry: {"charge":"ch_1"} replayed=true
	// charges at the API: 1
}
