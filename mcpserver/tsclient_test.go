package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
	"github.com/toolfence/toolfence/internal/testkit/npmci"
	"github.com/toolfence/toolfence/mcpserver"
)

// tsClientDir is the one Node project of the TypeScript SDK programs (client.mjs here,
// host.mjs in mcpproxy/interop); its package-lock.json pins @modelcontextprotocol/sdk, and
// `npm ci` installs it there.
const tsClientDir = "../internal/fixture/testdata/tsclient"

// tsClient returns the node binary once node_modules of tsClientDir is installed, running
// `npm ci` at most once per test binary and only when package.json or package-lock.json
// changed since the last install (tarballs already in npm's cache are not downloaded
// again). Without node or npm the test fails under CI and is skipped otherwise.
func tsClient(t *testing.T) string {
	t.Helper()
	testkit.SkipShort(t, "needs node and npm (the TypeScript SDK)")
	node, errNode := exec.LookPath("node")
	npm, errNpm := exec.LookPath("npm")
	if err := errors.Join(errNode, errNpm); err != nil {
		msg := fmt.Sprintf("the TypeScript SDK interop test needs node and npm on PATH (Debian: apt-get install nodejs npm): %v", err)
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	require.NoError(t, npmci.Install(npm, tsClientDir))
	return node
}

// tsJob is the argument of client.mjs: how to reach the server.
type tsJob struct {
	Transport string            `json:"transport"` // "stdio" or "http"
	Command   string            `json:"command,omitempty"`
	Args      []string          `json:"args,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	URL       string            `json:"url,omitempty"`
	Token     string            `json:"token,omitempty"`
}

// tsReport is what client.mjs prints: what the TypeScript SDK client saw at each step.
type tsReport struct {
	Step            string   `json:"step"`
	Error           string   `json:"error"`
	ProtocolVersion string   `json:"protocolVersion"`
	Server          string   `json:"server"`
	Tools           []string `json:"tools"`
	Begin           struct {
		Decision string `json:"decision"`
		Key      string `json:"key"`
		Token    uint64 `json:"token"`
	} `json:"begin"`
	Commit struct {
		State string `json:"state"`
		Token uint64 `json:"token"`
	} `json:"commit"`
	Replay struct {
		Decision string          `json:"decision"`
		Result   json.RawMessage `json:"result"`
		Text     string          `json:"text"`
	} `json:"replay"`
	Open struct {
		Decision string `json:"decision"`
		Key      string `json:"key"`
	} `json:"open"`
	Pending struct {
		URI      string   `json:"uri"`
		MIMEType string   `json:"mimeType"`
		Keys     []string `json:"keys"`
	} `json:"pending"`
}

// TestInteropTypeScriptSDK: a host on the official MCP TypeScript SDK, over stdio (this test
// binary as the server process) and streamable HTTP, initializes, lists the tools (the SDK
// validates every tool schema), runs begin_call → commit_call → begin_call (replay), leaves a
// call open and reads toolfence://pending. The SDK also validates every structured result
// against the tool's output schema.
func TestInteropTypeScriptSDK(t *testing.T) {
	t.Parallel()
	node := tsClient(t)
	t.Run("stdio", func(t *testing.T) {
		t.Parallel()
		command, args, env := stdioServer(t, t.TempDir(), "default")
		job := tsJob{Transport: "stdio", Command: command, Args: args, Env: map[string]string{}}
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			job.Env[k] = v
		}
		checkTSReport(t, runTSClient(t, node, job))
	})
	t.Run("http", func(t *testing.T) {
		t.Parallel()
		e := setup(t, nil)
		checkTSReport(t, runTSClient(t, node, tsJob{Transport: "http", URL: e.url, Token: tokA}))
	})
}

func runTSClient(t *testing.T, node string, job tsJob) tsReport {
	t.Helper()
	arg, err := json.Marshal(job)
	require.NoError(t, err)
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(c, node, "client.mjs", string(arg))
	cmd.Dir = tsClientDir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var rep tsReport
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &rep), "client.mjs printed no report (%v)\nstdout: %s\nstderr: %s", runErr, stdout.String(), stderr.String())
	require.Empty(t, rep.Error, "TypeScript SDK client failed at %s\nstderr: %s", rep.Step, stderr.String())
	require.NoError(t, runErr, "stderr: %s", stderr.String())
	return rep
}

func checkTSReport(t *testing.T, rep tsReport) {
	t.Helper()
	require.Equal(t, legacy, rep.ProtocolVersion, "the SDK's latest protocol is negotiated")
	require.Equal(t, "toolfence", rep.Server)
	require.ElementsMatch(t, []string{"list_pending", "inspect_residual", "begin_call", "commit_call", "renew_lease", "resolve_residual", "reconcile"}, rep.Tools)
	require.Equal(t, mcpserver.DecisionProceed, rep.Begin.Decision)
	require.Positive(t, rep.Begin.Token)
	require.Equal(t, "succeeded", rep.Commit.State)
	require.Equal(t, rep.Begin.Token, rep.Commit.Token)
	require.Equal(t, mcpserver.DecisionReplay, rep.Replay.Decision, "the second begin_call replays")
	require.JSONEq(t, `{"message_id":"m-1"}`, string(rep.Replay.Result))
	require.Contains(t, rep.Replay.Text, "REPLAY")
	require.Equal(t, mcpserver.DecisionProceed, rep.Open.Decision)
	require.Equal(t, mcpserver.PendingURI, rep.Pending.URI)
	require.Equal(t, "application/json", rep.Pending.MIMEType)
	require.Equal(t, []string{rep.Open.Key}, rep.Pending.Keys, "the open call, and only it, is pending")
}
