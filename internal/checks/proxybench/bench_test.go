package proxybench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolfence/toolfence/examples/payments"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/internal/testkit/proxyrun"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/mcpwire"
)

// Targets of the proxy (docs/benchmarks.md), each within one run and for each revision of
// the host (rev=2026-07-28, rev=2025-11-25):
//   ProxyBypassed ≤ 1.05 × RelayFloor: a bypassed call costs what any process between costs;
//   ProxyProtected ≤ 1.2 × GuardedUpstreamCall: the proxy process adds at most 20 % to the
//   same guarded call made in-process.

// roleEnv makes the test binary the payments server, the relay or the proxy when it
// re-executes itself.
const roleEnv = testkit.RoleEnv

func TestMain(m *testing.M) {
	testkit.RunRole(map[string]func() int{
		"payments": func() int {
			_ = payments.Serve(context.Background(), &payments.FileLedger{Path: os.Getenv("PAYMENTS_LEDGER")})
			return 0
		},
		"relay": testkit.RoleFunc("relay", runRelay),
		"proxy": testkit.RoleFunc("proxy", runProxy),
	})
	os.Exit(m.Run())
}

// runProxy is what `toolfence proxy --store $TF_STORE --config $TF_POLICY --server-id
// payments -- payments` does, the payments server being this binary. With $TF_CPUPROFILE
// set it writes the proxy process's CPU profile there; with $TF_MEMSTATS set it prints what
// the proxy process allocated in all when it ends.
func runProxy() error {
	if path := os.Getenv("TF_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	pol, err := mcpproxy.LoadPolicy(os.Getenv("TF_POLICY"))
	if err != nil {
		return err
	}
	err = proxyrun.Serve(os.Getenv("TF_STORE"), interceptor.Options{}, mcpproxy.Options{ServerID: "payments", Policy: pol}, "payments")
	if os.Getenv("TF_MEMSTATS") != "" {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		fmt.Fprintf(os.Stderr, "proxy: allocated %d bytes in %d allocations\n", ms.TotalAlloc, ms.Mallocs)
	}
	return err
}

// runRelay is a byte relay between its stdio and the payments server (this binary): io.Copy
// each way (copyPlain), no parsing, the least a process in the path can do. Its stdio is read and
// written through the runtime poller, as the proxy's is (transport.Stdio).
func runRelay() error {
	for _, fd := range []int{0, 1} {
		if err := syscall.SetNonblock(fd, true); err != nil {
			return err
		}
	}
	stdin, stdout := os.NewFile(0, "stdin"), os.NewFile(1, "stdout")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), roleEnv+"=payments")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() {
		_, _ = copyPlain(in, stdin)
		_ = in.Close()
	}()
	if _, err := copyPlain(stdout, out); err != nil {
		return err
	}
	return cmd.Wait()
}

// copyPlain copies with read and write calls only (io.Copy between files would splice).
func copyPlain(dst io.Writer, src io.Reader) (int64, error) {
	return io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, 64<<10))
}

const (
	protect = `{"tools": {"charge": {"mode": "protect", "target": ["/order_id"]}}}`
	bypass  = `{"tools": {"charge": {"mode": "bypass"}}}`
)

// revisions are the protocol revisions the host benchmarks run in: the stateless one (the
// SDK's latest, "" here) and the last with sessions.
var revisions = []struct{ name, version string }{{"rev=2026-07-28", ""}, {"rev=2025-11-25", "2025-11-25"}}

// eachRevision runs bench once per revision, as a sub-benchmark.
func eachRevision(b *testing.B, run func(b *testing.B, version string)) {
	for _, r := range revisions {
		b.Run(r.name, func(b *testing.B) { run(b, r.version) })
	}
}

// hostIn starts role ("payments", or "proxy" with policy) as a child over stdio, connects an
// official Go SDK client speaking version ("" for the SDK's latest, 2026-07-28) to it, and
// makes one call so that the session and the proxy's tool list are warm. With
// $TF_WRAP_<role> set (say TF_WRAP_proxy="strace -c -f -o FILE"), the child runs under that
// command: how the syscall counts in docs/benchmarks.md were taken.
func hostIn(b *testing.B, role, policy, version string) *mcp.ClientSession {
	b.Helper()
	dir := b.TempDir()
	cmd := exec.Command(os.Args[0])
	if w := os.Getenv("TF_WRAP_" + role); w != "" {
		args := append(strings.Fields(w), os.Args[0])
		cmd = exec.Command(args[0], args[1:]...)
	}
	cmd.Env = append(os.Environ(), roleEnv+"="+role, "PAYMENTS_LEDGER="+filepath.Join(dir, "ledger.jsonl"),
		"TF_STORE="+filepath.Join(dir, "store"), "TF_POLICY="+filepath.Join(dir, "policy.json"))
	cmd.Stderr = os.Stderr
	if err := os.WriteFile(filepath.Join(dir, "policy.json"), []byte(policy), 0o600); err != nil {
		b.Fatal(err)
	}
	var opts *mcp.ClientSessionOptions
	if version != "" {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: version}
	}
	s, err := mcp.NewClient(&mcp.Implementation{Name: "bench-host", Version: "1"}, nil).Connect(b.Context(), &mcp.CommandTransport{Command: cmd}, opts)
	if err != nil {
		b.Fatal(err)
	}
	if want := cmpVersion(version); s.InitializeResult().ProtocolVersion != want {
		b.Fatalf("the host speaks %s, want %s", s.InitializeResult().ProtocolVersion, want)
	}
	b.Cleanup(func() { _ = s.Close() })
	charge(b, s, "warm-up")
	return s
}

// charge charges a new order and checks the answer is a first charge.
func charge(b *testing.B, s *mcp.ClientSession, order string) {
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"order_id": order, "amount_cents": 1250}})
	if err != nil {
		b.Fatal(err)
	}
	raw, _ := json.Marshal(res.StructuredContent)
	if res.IsError || !strings.Contains(string(raw), `"charge_id":"ch_`) || res.Meta[mcpwire.MetaReplayed] != nil {
		b.Fatalf("charge %s: %+v %s", order, res, raw)
	}
}

func bench(b *testing.B, s *mcp.ClientSession) {
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		charge(b, s, "order-"+strconv.Itoa(i))
	}
}

// cmpVersion is the revision a host asked for version speaks: version, or 2026-07-28.
func cmpVersion(version string) string {
	if version == "" {
		return "2026-07-28"
	}
	return version
}

// BenchmarkDirect is the baseline: an official Go SDK client calls charge (a new order each
// time: an fsynced append) on the payments server over stdio, in each revision.
func BenchmarkDirect(b *testing.B) {
	eachRevision(b, func(b *testing.B, v string) { bench(b, hostIn(b, "payments", "", v)) })
}

// BenchmarkProxyProtected is the same call through the proxy (a process between the two, on
// badger), charge protected: each new order is reserved and committed durably, then sent.
func BenchmarkProxyProtected(b *testing.B) {
	eachRevision(b, func(b *testing.B, v string) { bench(b, hostIn(b, "proxy", protect, v)) })
}

// BenchmarkProxyBypassed is the same call through the proxy with charge bypassed: relayed
// untouched.
func BenchmarkProxyBypassed(b *testing.B) {
	eachRevision(b, func(b *testing.B, v string) { bench(b, hostIn(b, "proxy", bypass, v)) })
}

// BenchmarkRelayFloor is the same call through a byte relay process (runRelay): what any
// process between host and upstream costs on this machine, the floor under ProxyBypassed.
func BenchmarkRelayFloor(b *testing.B) {
	eachRevision(b, func(b *testing.B, v string) { bench(b, hostIn(b, "relay", "", v)) })
}

// BenchmarkGuardedCall is interceptor's GuardedCall measured in this run: one guarded call
// after another (no-op tool, distinct keys) on badger with group commit.
func BenchmarkGuardedCall(b *testing.B) {
	ic, ctx := guard(b)
	tool := func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
		return interceptor.Response{Status: 200, Body: []byte(`{"ok":true}`)}, nil
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		res, err := ic.Do(ctx, interceptor.Call{Operation: "bench", Target: strconv.Itoa(i)}, tool)
		if err != nil || res.Replayed {
			b.Fatalf("call %d: %v %+v", i, err, res)
		}
	}
}

// guard is an interceptor on a fresh badger store with group commit (closed when b ends),
// and a context that names the task.
func guard(b *testing.B) (*interceptor.Interceptor, context.Context) {
	l, err := badger.Open(b.TempDir(), badger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	ic, err := interceptor.New(l, interceptor.Options{Holder: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	return ic, interceptor.WithTask(context.Background(), "bench")
}

// BenchmarkGuardedUpstreamCall is the protected call without the proxy process: this
// process guards each charge itself (interceptor.Do on badger with group commit, the charge
// made on the payments server directly), as a host with the guard inside it would. Its
// reservation and commit are spaced by the upstream's work, as the proxy's are, so
// (GuardedUpstreamCall − Direct) is the barrier's own cost around a real upstream call with
// no process between: what a protected call through a proxy adds, less the hop. It also
// reports the time of the reservation (begin-ns: from Do to the tool) and of the commit
// (commit-ns: from the tool's return to Do's). A reference beside the proxy's targets
// (docs/benchmarks.md).
func BenchmarkGuardedUpstreamCall(b *testing.B) {
	eachRevision(b, guardedUpstreamCall)
}

func guardedUpstreamCall(b *testing.B, version string) {
	s := hostIn(b, "payments", "", version)
	ic, ctx := guard(b)
	var begin, commit time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		order := "order-" + strconv.Itoa(i)
		var toolStart, toolEnd time.Time
		start := time.Now()
		res, err := ic.Do(ctx, interceptor.Call{Operation: "payments/charge", Target: order,
			Args: []byte(`{"order_id":"` + order + `","amount_cents":1250}`)},
			func(context.Context, interceptor.Dispatch) (interceptor.Response, error) {
				toolStart = time.Now()
				defer func() { toolEnd = time.Now() }()
				res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"order_id": order, "amount_cents": 1250}})
				if err != nil {
					return interceptor.Response{}, err
				}
				body, err := json.Marshal(res)
				return interceptor.Response{Status: 200, Body: body}, err
			})
		begin += toolStart.Sub(start)
		commit += time.Since(toolEnd)
		if err != nil || res.Replayed || !strings.Contains(string(res.Output), `"charge_id":"ch_`) {
			b.Fatalf("charge %s: %v %+v", order, err, res)
		}
	}
	b.ReportMetric(float64(begin)/float64(b.N), "begin-ns")
	b.ReportMetric(float64(commit)/float64(b.N), "commit-ns")
}
