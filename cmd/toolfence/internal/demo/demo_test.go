package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/ledger/postgres"
	"github.com/toolfence/toolfence/residual"
	"github.com/toolfence/toolfence/tools"
)

// workerEnv carries the JSON WorkerArgs when this test binary runs in the role "worker", the
// story's worker; in the role "fail" it exits at once, as a worker that dies before charging.
const workerEnv = "TOOLFENCE_DEMO_TEST_WORKER"

func TestMain(m *testing.M) {
	testkit.RunRole(map[string]func() int{
		"fail": func() int {
			fmt.Fprintln(os.Stderr, "worker: cannot start (on purpose)")
			return 3
		},
		"worker": func() int {
			var w WorkerArgs
			if err := json.Unmarshal([]byte(os.Getenv(workerEnv)), &w); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
			if err := RunWorker(context.Background(), w, os.Stdout); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			return 0
		},
	})
	goleak.VerifyTestMain(m)
}

// selfWorker re-executes this test binary as the worker process.
func selfWorker(ctx context.Context, w WorkerArgs) *exec.Cmd {
	raw, _ := json.Marshal(w)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), testkit.WithRole("worker"), workerEnv+"="+string(raw))
	return cmd
}

func stepNames(steps []Step) []string {
	var names []string
	for _, s := range steps {
		names = append(names, s.Name)
	}
	return names
}

// requireTimeline checks the steps of a story: each once and in order, except in_progress,
// which repeats while the dead worker's lease lives (and is missing on a machine stalled for
// a whole lease after the kill).
func requireTimeline(t *testing.T, rep *Report, out string) {
	t.Helper()
	want := []string{"api", "worker", "charge", "sigkill", "successor", "in_progress", "unknown_outcome", "reconcile", "replay", "answer"}
	got := stepNames(rep.Steps)
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
	require.Equal(t, want, compact, "timeline:\n%s", out)
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), len(got), "one line per step")
	for i := 1; i < len(rep.Steps); i++ {
		require.GreaterOrEqual(t, rep.Steps[i].Elapsed, rep.Steps[i-1].Elapsed)
	}
	// The successor could only reconcile once the dead worker's lease had expired: at
	// least a lease after the worker started.
	require.GreaterOrEqual(t, rep.Steps[len(rep.Steps)-1].Elapsed-rep.Steps[1].Elapsed, DefaultLeaseTTL)
	require.Contains(t, out, "a langchaingo OpenAIFunctionsAgent (scripted offline model) whose charge tool is guarded by toolfence")
	if slices.Contains(got, "in_progress") {
		require.Regexp(t, `in_progress\s+the agent's charge was refused: attempt 1 by demo-worker/pid-\d+ holds a live lease \(token 1\); the agent is told to retry after \d+ ms`, out)
	}
	require.Regexp(t, `reconcile\s+the agent called toolfence_reconcile: the probe asked the API by Idempotency-Key \(GET /charges\?idempotency_key=…: 200, charge ch_1 of INV-42\); residual unknown → succeeded under fencing token 2`, out)
	require.Equal(t, "Invoice INV-42 was charged exactly once; the recorded charge was replayed, not repeated.", rep.Answer)

	var replayed Charge
	require.NoError(t, json.Unmarshal(rep.Replayed, &replayed))
	require.Equal(t, Charge{ID: "ch_1", Invoice: Invoice, AmountCents: 4200, Currency: "EUR", IdempotencyKey: rep.Key, Status: "succeeded"}, replayed)
}

// requireLedger checks what the ledger holds after a story: one attempt by the dead worker,
// settled by the successor agent's reconcile tool through the probe.
func requireLedger(t *testing.T, l ledger.Ledger, rep *Report, task string) {
	t.Helper()
	r, err := l.Get(t.Context(), ledger.GetParams{Namespace: interceptor.DefaultNamespace, Key: rep.Key})
	require.NoError(t, err)
	require.Equal(t, residual.Succeeded, r.State)
	require.Equal(t, task, r.Task)
	require.Equal(t, Target, r.Target)
	require.Len(t, r.Attempts, 1)
	require.True(t, strings.HasPrefix(r.Attempts[0].Holder, "demo-worker/pid-"), r.Attempts[0].Holder)
	require.Equal(t, residual.Unknown, r.Attempts[0].Outcome)
	require.Len(t, r.Resolutions, 1)
	require.Equal(t, residual.Unknown, r.Resolutions[0].From)
	require.Equal(t, residual.Succeeded, r.Resolutions[0].To)
	require.True(t, strings.HasPrefix(r.Resolutions[0].By, "reconciler:demo-successor/pid-"), r.Resolutions[0].By)
	require.Equal(t, uint64(2), r.Token, "the resolution took a new fencing token")
	require.JSONEq(t, string(rep.Replayed), string(r.Result))
}

func TestRunTellsTheStoryWithOneCharge(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	var out bytes.Buffer
	rep, err := Run(t.Context(), Options{Store: store, Task: "story-1", StartWorker: selfWorker, Out: &out})
	require.NoError(t, err, "timeline:\n%s", out.String())
	require.Equal(t, 1, rep.Charges)
	requireTimeline(t, rep, out.String())

	l, err := badger.Open(store, badger.Options{})
	require.NoError(t, err)
	defer l.Close()
	requireLedger(t, l, rep, "story-1")
}

func TestRunFailsWhenTheWorkerDiesBeforeCharging(t *testing.T) {
	t.Parallel()
	rep, err := Run(t.Context(), Options{
		Store: t.TempDir(),
		StartWorker: func(ctx context.Context, _ WorkerArgs) *exec.Cmd {
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), testkit.WithRole("fail"))
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
	_, err := Run(t.Context(), Options{Store: t.TempDir()})
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

func TestGuardedChargeForwardsKeyAndTokenAndReplays(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var headers []http.Header
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		headers = append(headers, r.Header.Clone())
		mu.Unlock()
		writeJSON(w, http.StatusCreated, Charge{ID: "ch_9", Invoice: Invoice, AmountCents: 4200, Currency: "EUR", Status: "succeeded"})
	}))
	defer api.Close()
	l, err := badger.Open(t.TempDir(), badger.Options{})
	require.NoError(t, err)
	defer l.Close()
	ic, err := interceptor.New(l, interceptor.Options{Holder: "test"})
	require.NoError(t, err)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	charge := GuardedCharge(ic, tr, api.URL)
	require.NoError(t, charge.Err())
	require.Equal(t, Operation, charge.Name())
	ctx := interceptor.WithTask(t.Context(), "t-1")

	out, err := charge.Call(ctx, ChargeArgs)
	require.NoError(t, err)
	require.JSONEq(t, `{"id":"ch_9","invoice":"INV-42","amount_cents":4200,"currency":"EUR","idempotency_key":"","status":"succeeded"}`, out)
	require.Len(t, headers, 1)
	key := ic.Key("t-1", Operation, Target)
	require.Equal(t, `"`+key+`"`, headers[0].Get("Idempotency-Key"), "sent as a structured-field string")
	require.Equal(t, "1", headers[0].Get(tools.HeaderFencingToken))

	again, err := charge.Call(ctx, ChargeArgs)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(again, interceptor.ReplayPrefix), again)
	require.True(t, strings.HasSuffix(again, ": "+out), "the replay carries the first answer byte for byte: %s", again)
	require.Len(t, headers, 1, "a replay does not reach the API")

	// No invoice: refused before anything is reserved.
	out, err = charge.Call(ctx, `{"amount_cents":1}`)
	require.NoError(t, err)
	require.Contains(t, out, "invalid input for charge, nothing was sent")
	require.Len(t, headers, 1)

	// A transport error is an unknown outcome, not a failure: the agent is told to reconcile.
	api.Close()
	out, err = charge.Call(interceptor.WithTask(t.Context(), "t-2"), ChargeArgs)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, seenUnknown), out)
}

func TestWaitArgsAndTool(t *testing.T) {
	t.Parallel()
	args, err := waitArgs(`blocked: another attempt at charge on "invoice:INV-42" is still running and may reach the payment API; do not retry now — check again in 1.372s, when its lease expires (key tf1_x)`)
	require.NoError(t, err)
	require.Equal(t, `{"ms":1422}`, args)
	args, err = waitArgs("blocked: another attempt … check again until its lease expires")
	require.NoError(t, err)
	require.Equal(t, `{"ms":150}`, args)

	out, err := waitTool{}.Call(t.Context(), `{"ms":1}`)
	require.NoError(t, err)
	require.Equal(t, "waited 1 ms", out)
	out, err = waitTool{}.Call(t.Context(), `{"ms":-1}`)
	require.NoError(t, err)
	require.Contains(t, out, "invalid input for wait")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = waitTool{}.Call(ctx, `{"ms":30000}`)
	require.ErrorIs(t, err, context.Canceled)
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
	w := WorkerArgs{Store: "postgres://u:secret@h/db", API: "http://a", Task: "t"}
	require.Equal(t, []string{"--namespace", "default", "--api", "http://a", "--task", "t", "--lease", "1.5s"}, w.Flags(),
		"the store (a DSN may hold a password) is not on the command line")
	require.ErrorContains(t, RunWorker(t.Context(), WorkerArgs{Store: "/s"}, io.Discard), "required")
}

// TestRunOnPostgres tells the story on PostgreSQL, in a schema of its own that Keep keeps.
// It fails when no server answers: the PostgreSQL tests never skip.
func TestRunOnPostgres(t *testing.T) {
	t.Parallel()
	dsn := testkit.PostgresDSN(t)
	var out bytes.Buffer
	rep, err := Run(t.Context(), Options{Store: dsn, Keep: true, Task: "story-pg", StartWorker: selfWorker, Out: &out})
	if rep != nil && rep.Schema != "" {
		t.Cleanup(func() { require.NoError(t, dropSchema(context.Background(), dsn, rep.Schema)) })
	}
	require.NoError(t, err, "the PostgreSQL demo needs a server at TOOLFENCE_TEST_PG=%q (make test starts one via .ci/run); timeline:\n%s", dsn, out.String())
	require.Equal(t, 1, rep.Charges)
	require.True(t, strings.HasPrefix(rep.Schema, "toolfence_demo_"), rep.Schema)
	require.Contains(t, rep.Store, "search_path="+rep.Schema)
	requireTimeline(t, rep, out.String())

	l, err := postgres.Open(t.Context(), rep.Store, postgres.Options{DisableAutoMigrate: true})
	require.NoError(t, err)
	defer l.Close()
	require.Equal(t, rep.Schema, l.Schema())
	requireLedger(t, l, rep, "story-pg")
}
