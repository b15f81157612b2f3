// Command mcp-proxy is the crash-and-hand-over story of `toolfence proxy`: an agent (a real
// MCP host process, driven by a scripted model) charges an order through `toolfence proxy
// … -- payments`, a fake payments MCP server; the agent's process group (the agent and the
// proxy it started) is SIGKILLed after the payments server charged the card and before it
// answered. A successor agent, with a new proxy on the same store, re-issues the call: its
// proxy meets the unknown outcome, asks the payments server through the policy's probe
// (find_charge), records the charge as done and replays it. The payments ledger ends with
// exactly one charge.
//
//	go run ./examples/mcp-proxy
//
// It runs offline: it builds toolfence and the payments server with `go build` (or takes
// them from -toolfence and -payments), keeps everything in a temporary directory (or -dir)
// and exits non-zero unless the payments ledger holds exactly one charge.
package main

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	lctools "github.com/tmc/langchaingo/tools"

	"github.com/toolfence/toolfence/examples/payments"
	"github.com/toolfence/toolfence/examples/scripted"
)

// policy is the proxy's policy file (YAML): charge protected, keyed by its order id, with
// find_charge as its probe; the read-only tools bypassed.
//
//go:embed policy.yaml
var policy []byte

const (
	order = "ORD-1042"
	args  = `{"order_id":"ORD-1042","amount_cents":12500}`
	input = "Charge order ORD-1042: 125.00 EUR."
	// lease is the proxy's lease: how long a dead agent's call blocks its key before the
	// successor may settle it.
	lease = "2s"
)

func main() {
	agent := flag.Int("agent", 0, "internal: play agent run N (1 is killed mid-call)")
	tf := flag.String("toolfence", "", "the toolfence binary (default: go build ./cmd/toolfence)")
	pay := flag.String("payments", "", "the payments server binary (default: go build ./examples/mcp-proxy/payments)")
	dir := flag.String("dir", "", "work directory (store, ledger, policy); default a temporary one, removed at the end")
	flag.Parse()
	if *agent > 0 {
		os.Exit(runAgent(*agent, *tf, *pay, *dir))
	}
	if err := story(*tf, *pay, *dir); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
}

func story(tf, pay, dir string) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "toolfence-mcp-proxy-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), policy, 0o644); err != nil {
		return err
	}
	if tf == "" || pay == "" {
		fmt.Println("building toolfence and the payments server (go build)")
		cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator),
			"github.com/toolfence/toolfence/cmd/toolfence", "github.com/toolfence/toolfence/examples/mcp-proxy/payments")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build: %w\n%s", err, out)
		}
		tf, pay = filepath.Join(dir, "toolfence"), filepath.Join(dir, "payments")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	ledger := filepath.Join(dir, "ledger.jsonl")

	fmt.Println("== run 1: the agent charges", order, "through toolfence proxy; it is killed mid-call")
	run1 := exec.Command(exe, "-agent", "1", "-toolfence", tf, "-payments", pay, "-dir", dir)
	run1.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the agent and its proxy: one group, one kill
	copied, err := startPrefixed(run1, "run 1 | ")
	if err != nil {
		return err
	}
	charge, err := waitForCharge(ledger, 60*time.Second)
	if err != nil {
		_ = syscall.Kill(-run1.Process.Pid, syscall.SIGKILL)
		<-copied
		_ = run1.Wait()
		return err
	}
	fmt.Printf("payments: charged %s for %s (durable), and has not answered yet\n", charge.ID, charge.OrderID)
	_ = syscall.Kill(-run1.Process.Pid, syscall.SIGKILL)
	<-copied
	werr := run1.Wait()
	var exit *exec.ExitError
	if !errors.As(werr, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		return fmt.Errorf("run 1 was not killed by SIGKILL: %v", werr)
	}
	fmt.Printf("run 1 ended: %v — with its proxy, before the charge's answer came back\n", werr)

	fmt.Println("== run 2: a successor agent (a new proxy on the same store) re-issues the call")
	run2 := exec.Command(exe, "-agent", "2", "-toolfence", tf, "-payments", pay, "-dir", dir)
	copied, err = startPrefixed(run2, "run 2 | ")
	if err != nil {
		return err
	}
	<-copied
	if err := run2.Wait(); err != nil {
		return fmt.Errorf("run 2: %w", err)
	}

	cs, err := payments.ReadLedger(ledger)
	if err != nil {
		return err
	}
	var ids []string
	for _, c := range cs {
		ids = append(ids, c.ID+" "+c.OrderID)
	}
	fmt.Printf("payments ledger: %d charge(s): %s\n", len(cs), strings.Join(ids, ", "))
	if len(cs) != 1 {
		return fmt.Errorf("want exactly one charge, the ledger has %d", len(cs))
	}
	fmt.Println("OK: exactly one charge")
	return nil
}

// startPrefixed starts cmd with its stdout copied to ours, each line prefixed; the channel
// closes when the copy is done (the process and its children closed their stdout).
func startPrefixed(cmd *exec.Cmd, prefix string) (chan struct{}, error) {
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			fmt.Printf("%s%s\n", prefix, sc.Text())
		}
	}()
	return done, nil
}

// waitForCharge polls the payments ledger until it holds a charge.
func waitForCharge(ledger string, timeout time.Duration) (payments.Charge, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		cs, err := payments.ReadLedger(ledger)
		if err != nil {
			return payments.Charge{}, err
		}
		if len(cs) > 0 {
			return cs[0], nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return payments.Charge{}, fmt.Errorf("no charge reached the payments server within %v", timeout)
}

// runAgent is one agent process: an MCP host (official Go SDK client) that starts
// `toolfence proxy … -- payments` over stdio and lets a scripted model call its tools.
func runAgent(run int, tf, pay, dir string) int {
	up := []string{pay, "--ledger", filepath.Join(dir, "ledger.jsonl")}
	if run == 1 {
		up = append(up, "--pause-after-charge")
	}
	proxy := exec.Command(tf, append([]string{"proxy", "--store", filepath.Join(dir, "store"), "--server-id", "payments",
		"--config", filepath.Join(dir, "policy.yaml"), "--lease", lease, "--"}, up...)...)
	proxy.Stderr = os.Stderr
	ctx := context.Background()
	sess, err := mcp.NewClient(&mcp.Implementation{Name: "example-agent", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: proxy}, nil)
	if err != nil {
		fmt.Println("agent: starting the proxy:", err)
		return 2
	}
	defer sess.Close()
	fmt.Printf("agent: MCP host, talking to: %s\n", strings.Join(proxy.Args, " "))

	tools := []lctools.Tool{&mcpTool{sess: sess, name: "charge", desc: "Charge an order's card."}, waitTool{}}
	if run == 1 {
		model := &scripted.Model{Steps: []scripted.Step{
			{Think: "I will charge the order.", Tool: "charge", Args: args},
			{Final: "Charged."},
		}}
		out, err := scripted.Run(ctx, model, tools, input)
		fmt.Printf("agent: run 1 was not killed (answer %q, error %v)\n", out, err)
		return 3
	}
	model := &scripted.Policy{Rules: []scripted.Rule{
		{Think: "The order still needs charging.", Tool: "charge", Args: args},
		{When: "blocked: another attempt", Think: "Another attempt is still running; I wait as told.", Tool: "wait", ArgsFrom: waitArgs},
		{When: "waited", Think: "Asking again.", Tool: "charge", Args: args},
		{When: "[replayed]", Final: "Order " + order + " is charged, once: the proxy settled run 1's charge and returned it."},
		{When: "blocked: a previous attempt may have reached", Final: "Run 1's charge may have gone through, so I must not charge again; " +
			"a person must settle it (toolfence resolve) before the order can go on."},
		{When: "{", Final: "Charged."},
	}}
	answer, err := scripted.RunAgent(ctx, model, tools, input, 10)
	if err != nil {
		fmt.Println("agent: run 2 failed:", err)
		return 1
	}
	fmt.Println("agent: run 2 finished:", answer)
	return 0
}

var checkAgain = regexp.MustCompile(`check again in (\S+?),`)

// waitArgs takes the wait out of an in-progress answer ("check again in 1.2s, when …").
func waitArgs(answer string) (string, error) {
	m := checkAgain.FindStringSubmatch(answer)
	if m == nil {
		return `{"duration":"1s"}`, nil
	}
	return fmt.Sprintf(`{"duration":%q}`, m[1]), nil
}

// mcpTool is a langchaingo tool that calls an MCP tool through the session and answers
// with the result's text (an isError result's text is the proxy's observation: what
// happened and what to do).
type mcpTool struct {
	sess       *mcp.ClientSession
	name, desc string
}

func (t *mcpTool) Name() string        { return t.name }
func (t *mcpTool) Description() string { return t.desc }

func (t *mcpTool) Call(ctx context.Context, input string) (string, error) {
	var a map[string]any
	if err := json.Unmarshal([]byte(input), &a); err != nil {
		return "", fmt.Errorf("%s: arguments: %w", t.name, err)
	}
	res, err := t.sess.CallTool(ctx, &mcp.CallToolParams{Name: t.name, Arguments: a})
	if err != nil {
		return "", err
	}
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n"), nil
}

// waitTool sleeps as long as the model asks (at most 10 s).
type waitTool struct{}

func (waitTool) Name() string { return "wait" }
func (waitTool) Description() string {
	return `Wait before checking again. Input: {"duration": "1.5s"}.`
}

func (waitTool) Call(ctx context.Context, input string) (string, error) {
	var a struct {
		Duration string `json:"duration"`
	}
	if err := json.Unmarshal([]byte(input), &a); err != nil {
		return "", err
	}
	d, err := time.ParseDuration(a.Duration)
	if err != nil {
		return "", err
	}
	d = min(d+100*time.Millisecond, 10*time.Second)
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case <-time.After(d):
	}
	return "waited " + d.String(), nil
}
