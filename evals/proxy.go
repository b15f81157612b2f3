package evals

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolfence/toolfence/examples/payments"
	"github.com/toolfence/toolfence/mcpwire"
)

// The proxy subjects: an MCP host (the worker) calls the payments MCP server (a real process,
// examples/payments, whose charges are the sink's effects) through `toolfence proxy` or
// through a bare relay. The worker process and the proxy (or relay) it starts share a process
// group, so one SIGKILL or SIGSTOP hits both; the upstream server runs in its own group, as
// the proxy starts it, and ends when its stdin closes.
const (
	// subjectToolfenceProxy is `toolfence proxy` on badger in front of the payments server,
	// charge protected with the order id as target.
	subjectToolfenceProxy = "toolfence-proxy"
	// subjectPassThrough is the same host and upstream behind a relay that forwards every
	// byte: no guard.
	subjectPassThrough = "pass-through"
)

// proxyServerID is the --server-id of the eval's proxy (operation "payments/charge").
const proxyServerID = "payments"

// proxyScenarios are the scenarios the proxy subjects run: the host (and with it the proxy)
// killed before the call (b0), after the upstream's effect while the sink holds its answer
// (b1), after the host got the answer (b2), and stopped past the lease (zombie).
var proxyScenarios = []string{"crash-b0", "crash-b1", "crash-b2", "zombie"}

// isProxySubject reports whether subject is one of the MCP proxy subjects.
func isProxySubject(subject string) bool {
	return subject == subjectToolfenceProxy || subject == subjectPassThrough
}

// runs reports whether the cell scenario × subject is run: the proxy subjects run only
// proxyScenarios.
func runs(scenario, subject string) bool {
	return !isProxySubject(subject) || slices.Contains(proxyScenarios, scenario)
}

// proxyPolicy is the eval proxy's policy file (docs/proxy.md): charge keyed by its order id,
// with find_charge as its probe (the sink's lookup by intent), so an unknown outcome is
// settled by asking the payments server.
const proxyPolicy = `{"tools": {
  "charge": {"mode": "protect", "target": ["/order_id"],
             "probe": {"tool": "find_charge", "arguments": {"order_id": "/order_id"}, "found": "/found"}},
  "find_charge": {"mode": "bypass"},
  "list_charges": {"mode": "bypass"}
}}
`

// cmdSpec is a command the worker starts (the proxy or the relay, with the upstream's
// command line after "--").
type cmdSpec struct {
	Path string   `json:"path"`
	Args []string `json:"args"`
	Env  []string `json:"env,omitempty"`
}

func specOf(c *exec.Cmd) *cmdSpec { return &cmdSpec{Path: c.Path, Args: c.Args, Env: c.Env} }

func (c *cmdSpec) cmd() *exec.Cmd {
	cmd := exec.Command(c.Path)
	cmd.Args, cmd.Env = c.Args, c.Env
	return cmd
}

// proxyCommand is the command of the batch's proxy (or relay) in front of a payments server
// that charges into the sink; hold makes the sink hold the answer of each order's first
// charge (barrier b1).
func (b *batch) proxyCommand(hold bool) *cmdSpec {
	up := []string{"--sink", b.r.sink.base}
	if hold {
		up = append(up, "--hold")
	}
	upstream := b.r.cfg.Command("payments", up...)
	argv := append([]string{"--"}, upstream.Args...)
	argv[1] = upstream.Path
	if b.Subject == subjectPassThrough {
		return specOf(b.r.cfg.Command("relay", argv...))
	}
	args := []string{"--store", b.store, "--server-id", proxyServerID, "--config", b.r.proxyPolicy,
		"--lease", b.r.cfg.LeaseTTL.String()}
	return specOf(b.r.cfg.Command("proxy", append(args, argv...)...))
}

// writeProxyPolicy writes the proxy's policy file into the work directory.
func (r *runner) writeProxyPolicy() error {
	r.proxyPolicy = filepath.Join(r.cfg.WorkDir, "proxy-policy.json")
	return os.WriteFile(r.proxyPolicy, []byte(proxyPolicy), 0o644)
}

// runProxyHost is the worker of a proxy subject: an MCP host (official Go SDK client, asking
// for the spec's revision) that starts the batch's proxy over stdio and runs every trial's
// charge through it at once.
func (w *worker) runProxyHost(ctx context.Context, emit func(Belief)) {
	trials := w.trials()
	cmd := w.spec.Proxy.cmd()
	cmd.Stderr = os.Stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "toolfence-eval-host", Version: "1"}, nil)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	sess, err := client.Connect(cctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: time.Second},
		&mcp.ClientSessionOptions{ProtocolVersion: w.spec.HostRevision})
	cancel()
	if err == nil && w.spec.HostRevision != "" && sess.InitializeResult().ProtocolVersion != w.spec.HostRevision {
		err = fmt.Errorf("the host asked for MCP %s and got %s", w.spec.HostRevision, sess.InitializeResult().ProtocolVersion)
		_ = sess.Close()
	}
	if err != nil {
		for _, t := range trials {
			emit(Belief{Worker: w.spec.Name, Intent: t.Intent, State: BeliefBlocked, Reason: "proxy unavailable, not dispatched: " + err.Error()})
		}
		return
	}
	defer sess.Close()
	var wg sync.WaitGroup
	for k, t := range trials {
		tw := w.forTrial(k, t)
		wg.Go(func() {
			b := tw.proxyAgent(ctx, sess)
			b.Worker, b.Intent = w.spec.Name, t.Intent
			tw.print(fmt.Sprintf("BARRIER %d 0 %s", k, barrierDone))
			emit(b)
		})
	}
	wg.Wait()
}

// proxyAgent is the host's agent runtime for one trial: it calls charge (the trial's task in
// _meta; at most spec.Active calls of the process at once, as a host would pace them),
// waits out in-progress refusals, retries an upstream error up to 4 times (as agent
// runtimes do), believes a result (first or replayed) and gives up as blocked on an
// unknown outcome (awaiting reconciliation), another refusal, or a dead proxy.
func (w *worker) proxyAgent(ctx context.Context, sess *mcp.ClientSession) Belief {
	w.barrier(0, barrierB0, nil)
	deadline := w.deadline()
	ctx, cancel := context.WithDeadline(ctx, deadline.Add(10*time.Minute)) // a held answer outlives the budget
	defer cancel()
	var last string
	tk := &ticket{gate: w.gate}
	defer tk.leave()
	first := true
	for errs := 0; errs < 4 && time.Now().Before(deadline); {
		// At most Active calls of the batch are in flight at once (as for the other
		// subjects), but for a first call whose answer the sink will hold.
		if !first || !w.spec.Hold {
			tk.enter()
		}
		first = false
		res, err := sess.CallTool(ctx, &mcp.CallToolParams{
			Name:      "charge",
			Arguments: map[string]any{"order_id": w.spec.Intent, "amount_cents": 4200},
			Meta:      mcp.Meta{mcpwire.MetaTask: w.spec.Task},
		})
		tk.leave()
		if err != nil {
			return Belief{State: BeliefBlocked, Reason: "the proxy is gone: " + err.Error()}
		}
		if !res.IsError {
			var out payments.ChargeOut
			raw, _ := json.Marshal(res.StructuredContent)
			if json.Unmarshal(raw, &out) != nil || out.ChargeID == "" {
				return Belief{State: BeliefBlocked, Reason: "a result without a charge id: " + string(raw)}
			}
			w.barrier(0, barrierB2, nil)
			return Belief{State: BeliefDone, Result: out.ChargeID}
		}
		kind := errorKind(res)
		last = kind + ": " + resultText(res)
		switch kind {
		case "":
			errs++ // upstream's own error: retry, as agent runtimes do
			sleepCtx(ctx, 30*time.Millisecond)
		case "in_progress", "margin_too_small":
			sleepCtx(ctx, min(w.lease()/4, time.Until(deadline))+20*time.Millisecond)
		default:
			return Belief{State: BeliefBlocked, Reason: last}
		}
	}
	return Belief{State: BeliefBlocked, Reason: "gave up: " + last}
}

// errorKind is the kind of the proxy's details in an isError result's _meta, "" when the
// proxy made none (upstream's own error).
func errorKind(res *mcp.CallToolResult) string {
	raw, _ := json.Marshal(res.Meta[mcpwire.MetaError])
	var info struct {
		Kind string `json:"kind"`
	}
	_ = json.Unmarshal(raw, &info)
	return info.Kind
}

func resultText(res *mcp.CallToolResult) string {
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			return t.Text
		}
	}
	return ""
}

// PaymentsMain runs the payments MCP server on stdin and stdout with its charges performed
// by the eval's sink: --sink URL (required), --hold (the sink holds the answer of each
// order's first charge until the parent releases it). It returns the exit code: 2 for bad
// flags, 1 when the server fails.
func PaymentsMain(args []string) int {
	fs := flag.NewFlagSet("eval-payments", flag.ContinueOnError)
	base := fs.String("sink", "", "the sink's URL")
	hold := fs.Bool("hold", false, "ask the sink to hold the answer of each order's first charge")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *base == "" {
		fmt.Fprintln(os.Stderr, "evals: payments: --sink is required")
		return 2
	}
	// An orphan (its proxy was killed) exits at once, even with a charge in flight: nothing
	// can read its answer, and it must not hold the worker's stderr open.
	go func(parent int) {
		for range time.Tick(50 * time.Millisecond) {
			if os.Getppid() != parent {
				os.Exit(0)
			}
		}
	}(os.Getppid())
	err := payments.Serve(context.Background(), &sinkPayments{base: *base, hold: *hold})
	if err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintln(os.Stderr, "evals: payments:", err)
		return 1
	}
	return 0
}

// sinkPayments is the payments Backend of the eval: a charge is an effect of the sink (the
// order id its intent, the effect id the charge id).
type sinkPayments struct {
	base string
	hold bool
}

var sinkHTTP = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64}}

func (s *sinkPayments) Charge(ctx context.Context, orderID string, amountCents int64) (string, error) {
	body, _ := json.Marshal(map[string]any{"intent": orderID, "text": "charge order " + orderID, "amount_cents": amountCents})
	u := s.base + "/effect"
	if s.hold {
		u += "?hold=1"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.GetBody = nil // never resent by the transport: a resend would be a second charge
	req.Header.Set("Content-Type", "application/json")
	resp, err := sinkHTTP.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	ans, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("payment API answered %d: %s", resp.StatusCode, bytes.TrimSpace(ans))
	}
	return resultID(ans), nil
}

func (s *sinkPayments) Find(ctx context.Context, orderID string) (string, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/lookup?intent="+url.QueryEscape(orderID), nil)
	if err != nil {
		return "", false, err
	}
	resp, err := sinkHTTP.Do(req)
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	var ans lookupAnswer
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
		return "", false, fmt.Errorf("sink lookup: %w", err)
	}
	if len(ans.Effects) == 0 {
		return "", false, nil
	}
	return ans.Effects[0].ID, true, nil
}

func (s *sinkPayments) List(context.Context) ([]payments.Charge, error) {
	return nil, errors.New("list_charges is not served in the eval")
}

// RelayMain is the pass-through baseline: it starts the command after "--" (in its own
// process group, as the proxy starts an upstream) and copies stdin to it and its stdout to
// stdout, byte for byte, until either side ends. It returns the exit code (2 for bad
// arguments).
func RelayMain(args []string) int {
	i := slices.Index(args, "--")
	if i < 0 || i == len(args)-1 {
		fmt.Fprintln(os.Stderr, "evals: relay: give the upstream command after --")
		return 2
	}
	argv := args[i+1:]
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "evals: relay:", err)
		return 1
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "evals: relay:", err)
		return 1
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "evals: relay:", err)
		return 1
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(in, os.Stdin); _ = in.Close(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(os.Stdout, out); done <- struct{}{} }()
	<-done
	_ = in.Close()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
	return 0
}
