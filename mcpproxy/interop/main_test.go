package interop_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/fixture/mcpfixture"
	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

// bin is the toolfence binary TestMain builds; the tests run it as a host would. fxBin is
// the upstream fixtures' binary (internal/fixture/mcpfixture/cmd/mcpfixture), built without -race
// so that the many fixture processes start fast.
var bin, fxBin string

// everythingBin is the go-sdk's conformance everything-server (the go-sdk module of go.mod):
// a real server of MCP 2026-07-28 and 2025-11-25 whose tools ask for input in rounds.
var everythingBin string

func TestMain(m *testing.M) {
	os.Exit(testkit.RunWithBinaries(m, func(dir string) {
		bin, fxBin = filepath.Join(dir, "toolfence"), filepath.Join(dir, "mcpfixture")
		everythingBin = filepath.Join(dir, "everything-server")
	}, "github.com/toolfence/toolfence/cmd/toolfence", "github.com/toolfence/toolfence/internal/fixture/mcpfixture/cmd/mcpfixture",
		"github.com/modelcontextprotocol/go-sdk/conformance/everything-server"))
}

// fixtures are the upstream servers every cheap cell runs against.
var fixtures = []string{"gosdk", "mcpgo"}

// world is one test's setting: a store, the fixture's files, a policy and proxy flags.
type world struct {
	t                               *testing.T
	fixture                         string
	dir, store, effects, dispatches string
	mode, entered, gate             string
	pidFile                         string   // the process ModeKillParent kills, "" for the parent
	catalog                         string   // mcpfixture.EnvCatalog's file
	policy                          string   // path of the policy file, or ""
	flags                           []string // more proxy flags
	stderr                          *syncBuffer
	served                          []*exec.Cmd // what startServing started
	versions                        string      // the revisions the Go SDK fixture serves (mcpfixture.EnvVersions); "": all
}

// setup returns a world for fixture with policy (JSON, "" for none) and the default mode ok.
func setup(t *testing.T, fixture, policy string) *world {
	t.Helper()
	dir := t.TempDir()
	w := &world{t: t, fixture: fixture, dir: dir, store: filepath.Join(dir, "store"),
		effects: filepath.Join(dir, "effects"), dispatches: filepath.Join(dir, "dispatches"),
		mode: filepath.Join(dir, "mode"), catalog: filepath.Join(dir, "catalog"), stderr: &syncBuffer{}}
	if policy != "" {
		w.policy = filepath.Join(dir, "policy.json")
		require.NoError(t, os.WriteFile(w.policy, []byte(policy), 0o600))
	}
	w.setMode(mcpfixture.ModeOK)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stderr of the proxies and fixtures:\n%s", w.stderr)
		}
	})
	return w
}

func (w *world) setMode(m string) { require.NoError(w.t, os.WriteFile(w.mode, []byte(m), 0o600)) }

// fifos makes the fixture's entered and gate FIFOs (mcpfixture.EnvEntered, EnvGate).
func (w *world) fifos() {
	w.entered, w.gate = filepath.Join(w.dir, "entered"), filepath.Join(w.dir, "gate")
	require.NoError(w.t, syscall.Mkfifo(w.entered, 0o600))
	require.NoError(w.t, syscall.Mkfifo(w.gate, 0o600))
}

// awaitEntered blocks until the fixture has made its effect in ModeHang or ModeGate.
func (w *world) awaitEntered() {
	w.t.Helper()
	done := make(chan error, 1)
	go func() {
		b, err := os.ReadFile(w.entered)
		if err == nil && string(b) != "entered\n" {
			err = fmt.Errorf("read %q from the entered FIFO", b)
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(w.t, err)
	case <-time.After(30 * time.Second):
		w.t.Fatalf("the fixture never entered its blocking mode; stderr:\n%s", w.stderr)
	}
}

// awaitStderr waits (up to 30 s) until the proxies' and fixtures' stderr holds text.
func (w *world) awaitStderr(text string) {
	w.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(w.stderr.String(), text); {
		if time.Now().After(deadline) {
			w.t.Fatalf("stderr never said %q:\n%s", text, w.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// release lets the fixture's call in ModeGate answer.
func (w *world) release() {
	w.t.Helper()
	f, err := os.OpenFile(w.gate, os.O_WRONLY, 0)
	require.NoError(w.t, err)
	require.NoError(w.t, f.Close())
}

// env is the environment of hosts, proxies and fixtures of this world.
func (w *world) env() []string {
	return append(os.Environ(),
		mcpfixture.EnvEffects+"="+w.effects, mcpfixture.EnvDispatches+"="+w.dispatches,
		mcpfixture.EnvMode+"="+w.mode, mcpfixture.EnvEntered+"="+w.entered, mcpfixture.EnvGate+"="+w.gate,
		mcpfixture.EnvKillPIDFile+"="+w.pidFile, mcpfixture.EnvCatalog+"="+w.catalog, mcpfixture.EnvVersions+"="+w.versions)
}

// proxyArgv is the command a host runs: toolfence proxy in front of the fixture.
func (w *world) proxyArgv(store string) []string {
	argv := []string{bin, "proxy", "--store", store, "--server-id", "fx"}
	if w.policy != "" {
		argv = append(argv, "--config", w.policy)
	}
	argv = append(argv, w.flags...)
	return append(argv, "--", fxBin, w.fixture)
}

// directArgv is the command of the bare fixture (no proxy).
func (w *world) directArgv() []string { return []string{fxBin, w.fixture} }

// lines returns the lines of the file at path (none when it does not exist).
func (w *world) lines(path string) []string {
	w.t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(w.t, err)
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// effects counts the fixture's effects (its effects file, nothing else).
func (w *world) effectCount() int { return len(w.lines(w.effects)) }

// dispatchCount counts the calls that reached the fixture's append tool.
func (w *world) dispatchCount() int { return len(w.lines(w.dispatches)) }

// residuals opens the badger store (no proxy may hold it) and returns its residuals; none
// when the store was never created.
func (w *world) residuals() []*residual.Residual {
	w.t.Helper()
	return w.residualsIn("default")
}

// residualsIn is residuals of namespace ns.
func (w *world) residualsIn(ns string) []*residual.Residual {
	w.t.Helper()
	if _, err := os.Stat(filepath.Join(w.store, "MANIFEST")); os.IsNotExist(err) {
		return nil
	}
	l, err := badger.Open(w.store, badger.Options{})
	require.NoError(w.t, err)
	defer l.Close()
	page, err := l.List(context.Background(), ledger.ListParams{Namespace: ns})
	require.NoError(w.t, err)
	return page.Residuals
}

// outcome is a tools/call result as any host saw it, in one shape.
type outcome struct {
	IsError  bool
	Texts    []string
	Replayed bool
	Kind     string    // kind of the proxy's _meta error details, "" for none
	RPCError *rpcError // a JSON-RPC error instead of a result (hosts that report it as one)
	Raw      json.RawMessage
}

// rpcError is a JSON-RPC error a host got instead of a tool result.
type rpcError struct {
	Code    int64  `json:"code"`
	Message string `json:"message"`
}

func (o outcome) text() string { return strings.Join(o.Texts, "\n") }

// parseOutcome reads a CallToolResult from its JSON (as a host re-marshals it).
func parseOutcome(t *testing.T, raw []byte) outcome {
	t.Helper()
	o, err := decodeOutcome(raw)
	require.NoError(t, err)
	return o
}

// decodeOutcome reads a CallToolResult from its JSON; an error when it is not one.
func decodeOutcome(raw []byte) (outcome, error) {
	var r struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		IsError bool                       `json:"isError"`
		Meta    map[string]json.RawMessage `json:"_meta"`
		Error   *rpcError                  `json:"error"` // host.mjs's report of a JSON-RPC error
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return outcome{}, fmt.Errorf("not a tool result: %w: %s", err, raw)
	}
	o := outcome{IsError: r.IsError, RPCError: r.Error, Raw: raw}
	for _, c := range r.Content {
		if c.Type == "text" {
			o.Texts = append(o.Texts, c.Text)
		}
	}
	o.Replayed = string(r.Meta["toolfence.dev/replayed"]) == "true"
	if e := r.Meta["toolfence.dev/error"]; e != nil {
		var info struct {
			Kind string `json:"kind"`
		}
		if err := json.Unmarshal(e, &info); err != nil {
			return outcome{}, fmt.Errorf("_meta error details: %w: %s", err, e)
		}
		o.Kind = info.Kind
	}
	return o, nil
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (several processes' stderr).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
