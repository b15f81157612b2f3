// Command payments is the crash-and-hand-over story: an OpenAIFunctionsAgent charges an
// invoice through a payment API; run 1 is killed (SIGKILL) after the API charged the card and
// before toolfence recorded the outcome; run 2, a successor on the same task, meets the
// unknown outcome, reconciles through the probe and finishes with exactly one charge.
//
// It runs offline: a scripted model, a fake payment API on 127.0.0.1 and the embedded badger
// ledger in a temporary directory. It exits non-zero if the payment API's counts are wrong.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"syscall"
	"time"

	lctools "github.com/tmc/langchaingo/tools"

	"github.com/toolfence/toolfence/examples/scripted"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/tools"
)

const (
	task  = "invoice-run-INV-42"
	input = "Charge invoice INV-42: 125.00 EUR."
	args  = `{"invoice_id":"INV-42","amount_cents":12500,"currency":"EUR"}`
)

func main() {
	run1 := flag.Bool("run1", false, "internal: play run 1 (the parent kills it mid-call)")
	api := flag.String("api", "", "internal: the payment API's URL")
	dir := flag.String("ledger", "", "internal: the ledger directory")
	flag.Parse()
	if *run1 {
		os.Exit(runOne(*api, *dir))
	}
	if err := story(); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
}

// runOne is the first agent process. It never finishes: the parent kills it while the
// payment API holds the charge's answer.
func runOne(api, dir string) int {
	led, ic, err := open(dir, "agent-run-1", api)
	if err != nil {
		fmt.Println("run 1: opening the ledger:", err)
		return 2
	}
	defer led.Close()
	charge, err := chargeTool(api)
	if err != nil {
		fmt.Println("run 1:", err)
		return 2
	}
	model := &scripted.Model{Steps: []scripted.Step{
		{Think: "I will charge the invoice.", Tool: "charge_invoice", Args: args},
		{Final: "Charged."},
	}}
	ctx := interceptor.WithTask(context.Background(), task)
	out, err := scripted.Run(ctx, model, []lctools.Tool{charge.Tool(ic)}, input)
	fmt.Printf("run 1 was not killed (answer %q, error %v)\n", out, err)
	return 3
}

func story() error {
	dir, err := os.MkdirTemp("", "toolfence-payments-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	api := newPaymentAPI()
	api.hold = true
	srv := httptest.NewServer(api)
	defer srv.Close()

	fmt.Println("== run 1: the agent charges INV-42 and is killed mid-call")
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.Command(exe, "-run1", "-api", srv.URL, "-ledger", dir)
	child.Stderr = os.Stderr
	stdout, err := child.StdoutPipe()
	if err != nil {
		return err
	}
	if err := child.Start(); err != nil {
		return err
	}
	copied := make(chan struct{})
	go func() { prefixLines(os.Stdout, stdout, "run 1 | "); close(copied) }()
	select {
	case c := <-api.charged:
		fmt.Printf("payment API: charged %s (%d cents) for %s, and holds the answer\n", c.ID, c.AmountCents, c.InvoiceID)
		_ = child.Process.Signal(syscall.SIGKILL)
	case <-time.After(30 * time.Second):
		_ = child.Process.Kill()
		<-copied
		_ = child.Wait()
		return errors.New("run 1 never reached the payment API")
	}
	<-copied
	werr := child.Wait()
	fmt.Printf("run 1 ended: %v — the charge reached the API, no outcome was recorded\n", werr)
	var exit *exec.ExitError
	if !errors.As(werr, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		return fmt.Errorf("run 1 was not killed by SIGKILL: %v", werr)
	}

	fmt.Println("== run 2: a successor takes over the same task")
	led, ic, err := open(dir, "agent-run-2", srv.URL)
	if err != nil {
		return err
	}
	defer led.Close()
	ctx := interceptor.WithTask(context.Background(), task)
	if err := waitForExpiry(ctx, ic, ic.Key(task, "charge_invoice", "INV-42")); err != nil {
		return err
	}
	charge, err := chargeTool(srv.URL)
	if err != nil {
		return err
	}
	fmt.Printf("  the model sees the tool as %s: %s\n", charge.Name(), charge.Description())
	model := &scripted.Model{Steps: []scripted.Step{
		{Think: "The invoice still needs charging.", Tool: "charge_invoice", Args: args},
		{Expect: "blocked: a previous attempt may have reached the payment API; outcome unknown; do not retry — reconcile with toolfence",
			Think: "A charge may already have gone through; I must not retry blindly. Reconciling.", Tool: tools.ReconcileToolName, Args: `{}`},
		{Expect: "settled:", Think: "The probe found the charge. Asking again returns the recorded result.", Tool: "charge_invoice", Args: args},
		{Expect: interceptor.ReplayPrefix + "already done, outcome recorded at ", Final: "Invoice INV-42 was charged once (charge ch_1); nothing was charged twice."},
	}}
	answer, err := scripted.Run(ctx, model, []lctools.Tool{charge.Tool(ic), tools.Reconciler(ic)}, input)
	if err != nil {
		return fmt.Errorf("run 2: %w", err)
	}
	fmt.Println("run 2 finished:", answer)

	charges, posts, lookups := api.counts()
	fmt.Printf("upstream counts: charges=%d posts=%d lookups=%d\n", charges, posts, lookups)
	if charges != 1 || posts != 1 || lookups != 1 {
		return fmt.Errorf("want charges=1 posts=1 lookups=1")
	}
	fmt.Println("OK: exactly one charge")
	return nil
}

// waitForExpiry shows what the ledger holds and waits until the dead agent's lease expires.
func waitForExpiry(ctx context.Context, ic *interceptor.Interceptor, key string) error {
	r, err := ic.Ledger().Get(ctx, ledger.GetParams{Namespace: ic.Namespace(), Key: key})
	if err != nil {
		return fmt.Errorf("the ledger has no record of run 1's attempt: %w", err)
	}
	a := r.Current()
	fmt.Printf("ledger: %s is %s (attempt %d by %s, token %d, lease until %s)\n",
		key, r.State, a.N, a.Holder, a.Token, a.LeaseExpires.Format(time.RFC3339Nano))
	if wait := time.Until(a.LeaseExpires); wait > 0 {
		fmt.Printf("waiting %s for the dead agent's lease to expire\n", wait.Round(time.Millisecond))
		time.Sleep(wait + 20*time.Millisecond)
	}
	return nil
}

// prefixLines copies r to w line by line, each line prefixed.
func prefixLines(w io.Writer, r io.Reader, prefix string) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fmt.Fprintf(w, "%s%s\n", prefix, sc.Text())
	}
}
