package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolfence/toolfence/internal/testkit"
)

// The suite's client scenarios start a client with the URL of the scenario's server as its
// last argument. Here that client is this test binary in hostRole: an official go-sdk host
// that reaches the URL directly (viaEnv "direct") or through `toolfence proxy --upstream URL`
// as its stdio child ("proxy"), so that the proxy is the client the scenario's server judges.
const (
	hostRole     = "host"
	viaEnv       = "TOOLFENCE_CONFORMANCE_VIA"
	toolfenceEnv = "TOOLFENCE_CONFORMANCE_TOOLFENCE"
	storeEnv     = "TOOLFENCE_CONFORMANCE_STORE"
)

// hostScenario is what the host does in one client scenario: what the scenario's server
// expects of a client.
type hostScenario struct {
	// elicit, when set, answers elicitation/create (the host declares elicitation).
	elicit map[string]any
	do     func(ctx context.Context, s *mcp.ClientSession, calls []toolCall) error
}

// hostScenarios are the suite's client scenarios that apply to the proxy as a client of an
// HTTP upstream: every one whose server judges what arrives on the wire from the client
// (requests, headers, reconnections, answers to the server's own requests). Left out: the
// auth/* scenarios (OAuth flows: the proxy has no OAuth client, it sends an HTTP upstream the
// static --header values it is given) and the sep-2640-* skills extension (checking a skill
// document's digest is the host's decision; the proxy relays resources untouched, and the
// extension is in no requirement set).
var hostScenarios = map[string]hostScenario{
	// The client's initialize request (protocol version, clientInfo, capabilities).
	"initialize": {do: listTools},
	// A tools/call with numeric arguments.
	"tools_call": {do: calls(toolCall{"add_numbers", map[string]any{"a": 5, "b": 3}})},
	// A server's elicitation/create during a tools/call, answered with the schema's defaults.
	"elicitation-sep1034-client-defaults": {elicit: map[string]any{}, do: calls(toolCall{"test_client_elicitation_defaults", map[string]any{}})},
	// SEP-1699: the server closes the tools/call SSE stream after a priming event with
	// retry: 500; the client reconnects with GET and Last-Event-ID after the retry delay and
	// receives the result there.
	"sse-retry": {do: calls(toolCall{"test_reconnection", map[string]any{}})},
	// SEP-2575: _meta and MCP-Protocol-Version on every request, and the retry with a
	// supported version after -32022; connecting is enough.
	"request-metadata": {do: func(context.Context, *mcp.ClientSession, []toolCall) error { return nil }},
	// SEP-2106: tools/list must not make the client fetch a network $ref.
	"json-schema-ref-no-deref": {do: listTools},
	// SEP-1613: a tool's 2020-12 inputSchema survives tools/list; the host echoes it back.
	"json-schema-2020-12-preservation": {do: echoSchema},
	// SEP-2322: input-required results with requestState, fulfilled and echoed.
	"sep-2322-client-request-state": {elicit: map[string]any{"confirmed": true},
		do: calls(toolCall{"test_mrtr_echo_state", map[string]any{}}, toolCall{"test_mrtr_no_state", map[string]any{}},
			toolCall{"test_mrtr_unrelated", map[string]any{}}, toolCall{"test_mrtr_no_result_type", map[string]any{}})},
	// SEP-2243: Mcp-Method and Mcp-Name headers on tools, resources and prompts.
	"http-standard-headers": {do: touchEach},
	// SEP-2243: Mcp-Param-* headers from the tools' x-mcp-header annotations, for the calls
	// the scenario names in MCP_CONFORMANCE_CONTEXT.
	"http-custom-headers": {do: func(ctx context.Context, s *mcp.ClientSession, cs []toolCall) error {
		return calls(cs...)(ctx, s, nil)
	}},
	// SEP-2243: tools with invalid x-mcp-header annotations are left out of the listing; the
	// others are called.
	"http-invalid-tool-headers": {do: func(ctx context.Context, s *mcp.ClientSession, _ []toolCall) error {
		res, err := s.ListTools(ctx, nil)
		if err != nil {
			logf("tools/list: %v", err)
			return err
		}
		logf("tools/list: %d tools", len(res.Tools))
		for _, tool := range res.Tools {
			call(ctx, s, toolCall{tool.Name, map[string]any{"region": "us-west1"}})
		}
		return nil
	}},
}

// toolCall is a call the host makes; MCP_CONFORMANCE_CONTEXT's toolCalls have this shape.
type toolCall struct {
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
}

func logf(format string, args ...any) { fmt.Fprintf(os.Stderr, "host: "+format+"\n", args...) }

func listTools(ctx context.Context, s *mcp.ClientSession, _ []toolCall) error {
	res, err := s.ListTools(ctx, nil)
	if err != nil {
		logf("tools/list: %v", err)
		return err
	}
	logf("tools/list: %d tools", len(res.Tools))
	return nil
}

// calls returns a step that lists the tools and makes cs in order; a failed call is logged,
// not returned (the scenario's server judges).
func calls(cs ...toolCall) func(context.Context, *mcp.ClientSession, []toolCall) error {
	return func(ctx context.Context, s *mcp.ClientSession, _ []toolCall) error {
		if err := listTools(ctx, s, nil); err != nil {
			return err
		}
		for _, c := range cs {
			call(ctx, s, c)
		}
		return nil
	}
}

func call(ctx context.Context, s *mcp.ClientSession, c toolCall) {
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: c.Name, Arguments: c.Arguments})
	if err != nil {
		logf("tools/call %s: error: %v", c.Name, err)
		return
	}
	text, _ := json.Marshal(res.Content)
	logf("tools/call %s: isError=%v content=%.300s", c.Name, res.IsError, text)
}

func echoSchema(ctx context.Context, s *mcp.ClientSession, _ []toolCall) error {
	res, err := s.ListTools(ctx, nil)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(res.Tools, func(t *mcp.Tool) bool { return t.Name == "json_schema_2020_12_tool" })
	if i < 0 {
		return errors.New("tools/list has no json_schema_2020_12_tool")
	}
	call(ctx, s, toolCall{"json_schema_echo", map[string]any{"schema": res.Tools[i].InputSchema}})
	return nil
}

// touchEach calls the first tool, reads the first resource and gets the first prompt.
func touchEach(ctx context.Context, s *mcp.ClientSession, _ []toolCall) error {
	if res, err := s.ListTools(ctx, nil); err == nil && len(res.Tools) > 0 {
		call(ctx, s, toolCall{res.Tools[0].Name, map[string]any{}})
	}
	if res, err := s.ListResources(ctx, nil); err == nil && len(res.Resources) > 0 {
		_, err = s.ReadResource(ctx, &mcp.ReadResourceParams{URI: res.Resources[0].URI})
		logf("resources/read: %v", err)
	}
	if res, err := s.ListPrompts(ctx, nil); err == nil && len(res.Prompts) > 0 {
		_, err = s.GetPrompt(ctx, &mcp.GetPromptParams{Name: res.Prompts[0].Name, Arguments: map[string]string{}})
		logf("prompts/get: %v", err)
	}
	return nil
}

// runHost is the host role: the scenario of MCP_CONFORMANCE_SCENARIO against the URL that
// is its last argument, directly or through the proxy (viaEnv), within 25 s (the suite
// gives a client 30 s).
func runHost() error {
	url := os.Args[len(os.Args)-1]
	name := os.Getenv("MCP_CONFORMANCE_SCENARIO")
	sc, ok := hostScenarios[name]
	if !ok {
		return fmt.Errorf("no host for scenario %q", name)
	}
	var cfg struct {
		ToolCalls []toolCall `json:"toolCalls"`
	}
	if raw := os.Getenv("MCP_CONFORMANCE_CONTEXT"); raw != "" {
		if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
			return fmt.Errorf("MCP_CONFORMANCE_CONTEXT: %w", err)
		}
	}
	var tr mcp.Transport
	switch via := os.Getenv(viaEnv); via {
	case "direct":
		tr = &mcp.StreamableClientTransport{Endpoint: url}
	case "proxy":
		cmd := exec.Command(os.Getenv(toolfenceEnv), append(append([]string{"proxy", "--store", os.Getenv(storeEnv), "--server-id", "conformance"},
			repeats...), "--upstream", url)...)
		cmd.Stderr = os.Stderr
		tr = &mcp.CommandTransport{Command: cmd}
	default:
		return fmt.Errorf("%s=%q: want direct or proxy", viaEnv, via)
	}
	opts := &mcp.ClientOptions{}
	if sc.elicit != nil {
		opts.Capabilities = &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{}}
		opts.ElicitationHandler = func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: sc.elicit}, nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "toolfence-conformance-host", Version: "1.0.0"}, opts).Connect(ctx, tr, nil)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer s.Close()
	logf("connected, protocol %s", s.InitializeResult().ProtocolVersion)
	return sc.do(ctx, s, cfg.ToolCalls)
}

// clientScenarios are, per requirement set, the client scenarios of hostScenarios it
// requires (or runs unscored, as json-schema-2020-12-preservation); each runs at that set's
// wire version (--spec-version).
var clientScenarios = map[string][]string{
	"2025-11-25": {"initialize", "tools_call", "elicitation-sep1034-client-defaults", "sse-retry", "json-schema-2020-12-preservation"},
	"2026-07-28": {"tools_call", "request-metadata", "json-schema-ref-no-deref", "json-schema-2020-12-preservation",
		"sep-2322-client-request-state", "http-standard-headers", "http-custom-headers", "http-invalid-tool-headers"},
}

// vias are how the host reaches the scenario's server: alone, or through the proxy.
var vias = []string{"direct", "proxy"}

// clientRun is the outcome of one client scenario with the host direct or through the proxy.
type clientRun struct {
	results results
	stderr  string // the host's (and the proxy's) stderr, as the suite saved it
	err     error
}

// runClient runs the suite's client scenario at the wire version req with the host reaching
// its server via "direct" or "proxy" (a fresh store per run). A scenario that reports no
// check is broken.
func runClient(t *testing.T, s suiteCLI, req, scenario, via string) clientRun {
	exe, err := os.Executable()
	if err != nil || strings.ContainsAny(exe, " \t'\"") {
		return clientRun{err: fmt.Errorf("the suite splits --command at spaces; the test binary is %q (%v)", exe, err)}
	}
	dir := outDir(t, "client-"+req+"-"+scenario+"-"+via)
	out := filepath.Join(dir, "out")
	env := []string{testkit.WithRole(hostRole), viaEnv + "=" + via, toolfenceEnv + "=" + toolfenceBin, storeEnv + "=" + filepath.Join(dir, "store")}
	output, err := s.run(context.Background(), dir, env, "client", "--scenario", scenario, "--spec-version", req, "--command", exe, "-o", out)
	run := clientRun{err: err}
	if err == nil {
		run.err = run.results.readResults(out, "", output)
	}
	if run.err == nil && run.results.broken[scenario] == "" && !slices.ContainsFunc(slices.Sorted(maps.Keys(run.results.checks)), func(k string) bool { return scenarioOf(k) == scenario }) {
		run.results.broken[scenario] = "the suite reported no check for it: " + tail(output, 1)
	}
	if dirs, _ := filepath.Glob(filepath.Join(out, "*", "stderr.txt")); len(dirs) == 1 {
		b, _ := os.ReadFile(dirs[0])
		run.stderr = string(b)
	}
	return run
}

// TestClientSuite runs the client scenarios of clientScenarios with the go-sdk host reaching
// the suite's server directly and through `toolfence proxy --upstream`, and compares check by
// check per requirement set: every check that passes with the host alone passes through the
// proxy, none fails only through it, and the checks that fail directly are those of the
// baseline ("client direct REQUIREMENTS").
func TestClientSuite(t *testing.T) {
	t.Parallel()
	s, base := suite(t)
	type job struct{ req, scenario, via string }
	var jobs []job
	for _, req := range slices.Sorted(maps.Keys(clientScenarios)) {
		for _, sc := range clientScenarios[req] {
			for _, via := range vias {
				jobs = append(jobs, job{req, sc, via})
			}
		}
	}
	runs := make([]clientRun, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() { runs[i] = runClient(t, s, j.req, j.scenario, j.via) })
	}
	wg.Wait()
	merged := map[job]results{} // by requirement set and via
	for i, j := range jobs {
		if runs[i].err != nil {
			t.Fatalf("client scenario %s at %s, %s: %v", j.scenario, j.req, j.via, runs[i].err)
		}
		m, ok := merged[job{j.req, "", j.via}]
		if !ok {
			m = results{checks: map[string]check{}, broken: map[string]string{}}
			merged[job{j.req, "", j.via}] = m
		}
		maps.Copy(m.checks, runs[i].results.checks)
		maps.Copy(m.broken, runs[i].results.broken)
	}
	var rep report
	for _, req := range slices.Sorted(maps.Keys(clientScenarios)) {
		direct, proxy := merged[job{req, "", "direct"}], merged[job{req, "", "proxy"}]
		rep = append(rep,
			againstBaseline("client scenarios "+req+", go-sdk host directly", "client direct "+req, direct, base["client direct "+req]),
			againstDirect("client scenarios "+req+", go-sdk host through toolfence proxy --upstream", "client proxy "+req, direct, proxy, base["client proxy "+req]))
	}
	if !rep.failed() {
		t.Logf("client scenarios %v:\n%s", clientScenarios, rep)
		return
	}
	var logs []string
	for i, j := range jobs {
		sec := rep[2*slices.Index(slices.Sorted(maps.Keys(clientScenarios)), j.req)+slices.Index(vias, j.via)]
		if slices.ContainsFunc(sec.problems, func(p string) bool { return strings.Contains(p, " "+j.scenario+" | ") }) {
			logs = append(logs, fmt.Sprintf("--- %s at %s, %s: host stderr:\n%s", j.scenario, j.req, j.via, tail(runs[i].stderr, 15)))
		}
	}
	t.Errorf("the MCP conformance suite's client scenarios differ (baseline: %s; docs/testing.md):\n%s\n%s\n%s",
		baselineFile, rep, strings.Join(logs, "\n"), keepHint)
}
