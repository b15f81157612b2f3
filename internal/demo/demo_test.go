package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

// workerEnv carries the JSON WorkerArgs when this test binary runs as the story's worker.
const workerEnv = "TOOLFENCE_DEMO_TEST_WORKER"

// failEnv makes this test binary exit at once, as a worker that dies before charging.
const failEnv = "TOOLFENCE_DEMO_TEST_FAIL"

func TestMain(m *testing.M) {
	if os.Getenv(failEnv) != "" {
		fmt.Fprintln(os.Stderr, "worker: cannot start (on purpose)")
		os.Exit(3)
	}
	if raw := os.Getenv(workerEnv); raw != "" {
		var w WorkerArgs
		if err := json.Unmarshal([]byte(raw), &w); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if err := RunWorker(context.Background(), w, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// selfWorker re-executes this test binary as the worker process.
func selfWorker(ctx context.Context, w WorkerArgs) *exec.Cmd {
	raw, _ := json.Marshal(w)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"="+string(raw))
	return cmd
}

func stepNames(steps []Step) []string {
	var names []string
	for _, s := range steps {
		names = append(names, s.Name)
	}
	return names
}

func TestRunTellsTheStoryWithOneCharge(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	var out bytes.Buffer
	rep, err := Run(t.Context(), Config{Store: store, Task: "story-1", StartWorker: selfWorker, Out: &out})
	require.NoError(t, err, "timeline:\n%s", out.String())
	require.Equal(t, 1, rep.Charges)

	want := []string{"api", "worker", "charge", "sigkill", "in_progress", "unknown_outcome", "reconcile", "replay"}
	got := stepNames(rep.Steps)
	// Every step happens once, in order, except in_progress: the successor usually meets
	// the dead worker's live lease once, but a machine stalled for a whole lease after the
	// kill meets unknown_outcome at once.
	var compact []string
	for i, n := range got {
		if i == 0 || n != got[i-1] {
			compact = append(compact, n)
		}
	}
	if !slices.Contains(compact, "in_progress") {
		t.Logf("no in_progress step (slow machine): %v", got)
		want = slices.DeleteFunc(want, func(s string) bool { return s == "in_progress" })
	}
	require.Equal(t, want, compact, "timeline:\n%s", out.String())
	require.Len(t, strings.Split(strings.TrimSpace(out.String()), "\n"), len(got))
	for i := 1; i < len(rep.Steps); i++ {
		require.GreaterOrEqual(t, rep.Steps[i].Elapsed, rep.Steps[i-1].Elapsed)
	}
	// The successor could only reconcile once the dead worker's lease had expired: at
	// least a lease after the worker started.
	require.GreaterOrEqual(t, rep.Steps[len(rep.Steps)-1].Elapsed-rep.Steps[1].Elapsed, DefaultLeaseTTL)

	var replayed Charge
	require.NoError(t, json.Unmarshal(rep.Replayed, &replayed))
	require.Equal(t, Charge{ID: "ch_1", Invoice: Invoice, AmountCents: 4200, Currency: "EUR", IdempotencyKey: rep.Key, Status: "succeeded"}, replayed)

	// The ledger holds what happened: one attempt by the dead worker, settled by the probe.
	l, err := badger.Open(store, badger.Options{})
	require.NoError(t, err)
	defer l.Close()
	r, err := l.Get(t.Context(), ledger.GetParams{Namespace: interceptor.DefaultNamespace, Key: rep.Key})
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, r.State)
	require.Equal(t, "story-1", r.Task)
	require.Len(t, r.Attempts, 1)
	require.True(t, strings.HasPrefix(r.Attempts[0].Holder, "demo-worker/pid-"), r.Attempts[0].Holder)
	require.Equal(t, residual.Unknown, r.Attempts[0].Outcome)
	require.Len(t, r.Resolutions, 1)
	require.Equal(t, residual.Unknown, r.Resolutions[0].From)
	require.Equal(t, residual.Succeeded, r.Resolutions[0].To)
	require.Equal(t, uint64(2), r.Token, "the resolution took a new fencing token")
	require.JSONEq(t, string(rep.Replayed), string(r.Result))
}

func TestRunFailsWhenTheWorkerDiesBeforeCharging(t *testing.T) {
	t.Parallel()
	rep, err := Run(t.Context(), Config{
		Store: t.TempDir(),
		StartWorker: func(ctx context.Context, _ WorkerArgs) *exec.Cmd {
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), failEnv+"=1")
			return cmd
		},
	})
	require.ErrorContains(t, err, "before its charge reached the API")
	require.ErrorContains(t, err, "cannot start (on purpose)")
	require.NotNil(t, rep)
	require.Equal(t, 0, rep.Charges)
}

func TestRunRejectsIncompleteConfig(t *testing.T) {
	t.Parallel()
	_, err := Run(t.Context(), Config{Store: t.TempDir()})
	require.ErrorContains(t, err, "StartWorker")
}

func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func post(t *testing.T, c *http.Client, url, key, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/charges", strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

const chargeBody = `{"invoice":"INV-1","amount_cents":100,"currency":"EUR"}`

func TestPaymentAPICountsEveryChargeAndLooksThemUp(t *testing.T) {
	t.Parallel()
	api, err := StartAPI()
	require.NoError(t, err)
	defer api.Close()
	c := newClient(t)

	status, _ := post(t, c, api.URL, "", chargeBody)
	require.Equal(t, http.StatusBadRequest, status, "no Idempotency-Key: refused")
	status, _ = post(t, c, api.URL, "k1", `{"invoice":""}`)
	require.Equal(t, http.StatusBadRequest, status, "bad body: refused")
	require.Equal(t, 0, api.Count())

	status, body := post(t, c, api.URL, "k1", chargeBody)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, "k1", (<-api.Arrivals()).IdempotencyKey)
	status, _ = post(t, c, api.URL, "k1", chargeBody)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, 2, api.Count(), "the API does not deduplicate")

	got, ok := api.Lookup("k1")
	require.True(t, ok)
	var first Charge
	require.NoError(t, json.Unmarshal(body, &first))
	require.Equal(t, first, got, "lookup finds the first charge under the key")
	_, ok = api.Lookup("nope")
	require.False(t, ok)
}

func TestPaymentAPIHoldsTheAnswerUntilTheClientGoes(t *testing.T) {
	t.Parallel()
	api, err := StartAPI()
	require.NoError(t, err)
	c := newClient(t)
	api.HoldNext(1)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/charges", strings.NewReader(chargeBody))
		req.Header.Set("Idempotency-Key", "held")
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	require.Equal(t, "held", (<-api.Arrivals()).IdempotencyKey)
	select {
	case err := <-done:
		t.Fatalf("the held request was answered: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Equal(t, 1, api.Count(), "the charge happened although nobody heard about it")

	// Only the next charge was held; Close also ends a held request.
	status, _ := post(t, c, api.URL, "k2", chargeBody)
	require.Equal(t, http.StatusCreated, status)
	api.HoldNext(1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, api.URL+"/charges", strings.NewReader(chargeBody))
		req.Header.Set("Idempotency-Key", "held-2")
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-api.Arrivals()
	<-api.Arrivals()
	require.NoError(t, api.Close())
	require.Error(t, <-done, "closing the API drops the held request without an answer")
	require.NoError(t, api.Close(), "Close is idempotent")
}

func TestChargeToolForwardsKeyAndToken(t *testing.T) {
	t.Parallel()
	api, err := StartAPI()
	require.NoError(t, err)
	defer api.Close()
	tool := ChargeTool(newClient(t), api.URL)
	call := ChargeCall()
	resp, err := tool(t.Context(), interceptor.Dispatch{Key: "tf1_k", Token: 7, Args: call.Args})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.Status)
	require.Equal(t, residual.Succeeded, interceptor.DefaultClassifier(resp, err))
	c, ok := api.Lookup("tf1_k")
	require.True(t, ok)
	require.Equal(t, Invoice, c.Invoice)

	// A transport error is an unknown outcome, not a failure.
	api.Close()
	_, err = tool(t.Context(), interceptor.Dispatch{Key: "tf1_k2", Token: 8, Args: call.Args})
	require.Error(t, err)
	require.False(t, errors.Is(err, interceptor.ErrNoEffect))
}

func TestChargeProbe(t *testing.T) {
	t.Parallel()
	api, err := StartAPI()
	require.NoError(t, err)
	defer api.Close()
	c := newClient(t)
	status, _ := post(t, c, api.URL, "tf1_found", chargeBody)
	require.Equal(t, http.StatusCreated, status)
	probe := ChargeProbe(c, api.URL)

	pr, err := probe(t.Context(), &residual.Residual{Key: "tf1_found"})
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, pr.Outcome)
	require.Contains(t, string(pr.Result), `"id":"ch_1"`)
	require.Contains(t, pr.Evidence, "200, charge ch_1")

	pr, err = probe(t.Context(), &residual.Residual{Key: "tf1_missing"})
	require.NoError(t, err)
	require.Equal(t, residual.Failed, pr.Outcome, "no record at the API means no charge")

	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer broken.Close()
	pr, err = ChargeProbe(c, broken.URL)(t.Context(), &residual.Residual{Key: "tf1_found"})
	require.ErrorContains(t, err, "status 503")
	require.False(t, pr.Outcome.Terminal(), "an upstream error settles nothing")
}

func TestWorkerArgsFlags(t *testing.T) {
	t.Parallel()
	w := WorkerArgs{Store: "/s", API: "http://a", Task: "t"}
	require.Equal(t, []string{"--store", "/s", "--namespace", "default", "--api", "http://a", "--task", "t", "--lease", "1.5s"}, w.Flags())
	require.ErrorContains(t, RunWorker(t.Context(), WorkerArgs{Store: "/s"}, io.Discard), "required")
}
