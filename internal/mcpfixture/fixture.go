package mcpfixture

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Environment of a fixture process. Every path is optional: an empty one turns its feature off.
const (
	// EnvEffects is the file each effect of a mutating tool is appended to (one line
	// "tool|target|text", fsynced before the tool answers). Count effects there only.
	EnvEffects = "MCPFX_EFFECTS"
	// EnvDispatches is the file each call that reaches a mutating tool is appended to (one
	// line "tool|target|mode"), whether or not it then has an effect.
	EnvDispatches = "MCPFX_DISPATCHES"
	// EnvMode is a file holding the mode of calls that name none in their _meta (MetaMode).
	// Missing or empty: ModeOK.
	EnvMode = "MCPFX_MODE"
	// EnvEntered is a FIFO the tool writes one line to after its effect in ModeHang and
	// ModeGate (it blocks until a reader opens it): the test's signal that the effect is done.
	EnvEntered = "MCPFX_ENTERED"
	// EnvGate is a FIFO the tool reads to EOF in ModeGate before it answers: the test
	// releases the call by opening it for writing and closing it.
	EnvGate = "MCPFX_GATE"
	// EnvKillPIDFile names a file holding the process id ModeKillParent kills (for a fixture
	// served over HTTP, which is not the proxy's child). Unset: the parent process.
	EnvKillPIDFile = "MCPFX_KILL_PIDFILE"
	// EnvCatalog is a file read when the server starts: when it holds "v2", append's
	// description says so (a changed catalog, for pins). Missing or other: version 1.
	EnvCatalog = "MCPFX_CATALOG"
)

// MetaMode is the request _meta field (a string) that sets the mode of one call; it wins
// over the EnvMode file. _meta is not part of a toolfence key, so the same call may carry
// different modes.
const MetaMode = "mcpfx/mode"

// Modes of the mutating tools ("append").
const (
	// ModeOK: effect, then the result "appended TEXT to TARGET".
	ModeOK = "ok"
	// ModeIsError: effect, then an isError result "boom after the write".
	ModeIsError = "iserror"
	// ModeReject: no effect, an isError result "rejected: the mailbox is full, nothing was sent".
	ModeReject = "reject"
	// ModeInvalid: no effect, a JSON-RPC error -32602 (invalid params). Only the Go SDK
	// fixture can answer so (an mcp-go tool's errors are -32603); mcp-go answers ModeReject.
	ModeInvalid = "invalid"
	// ModeCrash: effect, then the process exits with status 3 without answering.
	ModeCrash = "crash"
	// ModeCrashBefore: no effect; the process exits with status 3 without answering.
	ModeCrashBefore = "crashbefore"
	// ModeKillParent: effect, then SIGKILL to the parent process (the proxy) or to the
	// process EnvKillPIDFile names, then (stdio) exit or (HTTP) never answer.
	ModeKillParent = "killparent"
	// ModeHang: effect, a line to EnvEntered, then no answer until the call is cancelled.
	ModeHang = "hang"
	// ModeGate: effect, a line to EnvEntered, then wait for EnvGate's EOF, then as ModeOK.
	ModeGate = "gate"
	// ModeProgress: effect, two notifications/progress (1/2 "half", 2/2 "done") when the
	// call has a progress token, then as ModeOK.
	ModeProgress = "progress"
)

// Tool names of both fixtures.
const (
	// ToolAppend is the mutating tool (annotated destructive): modes apply to it.
	ToolAppend = "append"
	// ToolNote appends an effect and answers "noted"; tests bypass it by policy.
	ToolNote = "note"
	// ToolRead is annotated readOnlyHint: true and answers "N lines" (the effects so far).
	ToolRead = "read"
	// ToolFind is annotated readOnlyHint: true and answers {"found": true|false}: whether
	// append's effect for its target and text is in the effects file (a probe for policies).
	ToolFind = "find"
)

// The resource and prompt of both fixtures (relayed untouched by the proxy).
const (
	// ResourceURI is a text resource whose contents are ResourceText.
	ResourceURI = "mcpfx://about"
	// ResourceText is the contents of ResourceURI.
	ResourceText = "an MCP fixture: append, note and read"
	// PromptName is a prompt with one required argument "who"; it answers one user
	// message "Say hello to WHO.".
	PromptName = "greet"
)

// Input is the arguments of append and note.
type Input struct {
	Target   string `json:"target" jsonschema:"where the line goes, e.g. inbox:bob"`
	Text     string `json:"text" jsonschema:"the line to append"`
	Priority int    `json:"priority,omitempty" jsonschema:"0 (default) to 9"`
}

// answer is what one call of a tool comes to, in SDK-neutral terms.
type answer struct {
	text     string
	isError  bool
	rpcCode  int64 // non-zero: answer with this JSON-RPC error instead of a result
	found    bool  // ToolFind's answer
	progress []progressStep
}

type progressStep struct {
	progress, total float64
	message         string
}

var errCancelled = errors.New("mcpfixture: the call was cancelled")

// appendDescription is append's description in the catalog version EnvCatalog names.
func appendDescription() string {
	if path := os.Getenv(EnvCatalog); path != "" {
		if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == "v2" {
			return "Append a line to the effects file (mutating), now in version 2."
		}
	}
	return "Append a line to the effects file (mutating)."
}

// modeOf is the mode of a call: its _meta's, else the EnvMode file's, else ModeOK.
func modeOf(meta map[string]any) string {
	if m, ok := meta[MetaMode].(string); ok && m != "" {
		return m
	}
	if path := os.Getenv(EnvMode); path != "" {
		if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) != "" {
			return strings.TrimSpace(string(b))
		}
	}
	return ModeOK
}

// appendLine appends line to the file named by env and fsyncs it; nothing when env is unset.
func appendLine(env, line string) error {
	path := os.Getenv(env)
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(f, line+"\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// signalEntered writes a line to the EnvEntered FIFO (blocking until the test reads it).
func signalEntered() error {
	path := os.Getenv(EnvEntered)
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = io.WriteString(f, "entered\n")
	return errors.Join(err, f.Close())
}

// waitGate reads the EnvGate FIFO to EOF.
func waitGate() error {
	path := os.Getenv(EnvGate)
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, f)
	return errors.Join(err, f.Close())
}

// run is the shared behaviour of the tools: the answer to one call of tool with in, mode.
// It exits the process in ModeCrash and ModeKillParent, and returns errCancelled when ctx
// ends in ModeHang.
func run(ctx context.Context, tool string, in Input, mode string) (answer, error) {
	switch tool {
	case ToolRead:
		b, _ := os.ReadFile(os.Getenv(EnvEffects))
		return answer{text: fmt.Sprintf("%d lines", strings.Count(string(b), "\n"))}, nil
	case ToolFind:
		b, _ := os.ReadFile(os.Getenv(EnvEffects))
		want := fmt.Sprintf("%s|%s|%s", ToolAppend, in.Target, in.Text)
		found := slices.Contains(strings.Split(string(b), "\n"), want)
		return answer{text: fmt.Sprintf(`{"found":%t}`, found), found: found}, nil
	case ToolNote:
		if err := appendLine(EnvEffects, fmt.Sprintf("note|%s|%s", in.Target, in.Text)); err != nil {
			return answer{}, err
		}
		return answer{text: "noted"}, nil
	}
	if err := appendLine(EnvDispatches, fmt.Sprintf("%s|%s|%s", tool, in.Target, mode)); err != nil {
		return answer{}, err
	}
	switch mode {
	case ModeReject:
		return answer{isError: true, text: "rejected: the mailbox is full, nothing was sent"}, nil
	case ModeInvalid:
		return answer{rpcCode: -32602, text: "invalid params: priority must be 0 to 9"}, nil
	case ModeCrashBefore:
		os.Exit(3)
	}
	if err := appendLine(EnvEffects, fmt.Sprintf("%s|%s|%s", tool, in.Target, in.Text)); err != nil {
		return answer{}, err
	}
	ok := answer{text: "appended " + in.Text + " to " + in.Target}
	switch mode {
	case ModeIsError:
		return answer{isError: true, text: "boom after the write"}, nil
	case ModeCrash:
		os.Exit(3)
	case ModeKillParent:
		if path := os.Getenv(EnvKillPIDFile); path != "" {
			b, err := os.ReadFile(path)
			if err != nil {
				return answer{}, err
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				return answer{}, fmt.Errorf("%s: %w", path, err)
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
			<-ctx.Done() // served over HTTP: the fixture lives on; this call never answers
			return answer{}, errCancelled
		}
		_ = syscall.Kill(os.Getppid(), syscall.SIGKILL)
		os.Exit(0)
	case ModeHang:
		if err := signalEntered(); err != nil {
			return answer{}, err
		}
		<-ctx.Done()
		return answer{}, errCancelled
	case ModeGate:
		if err := errors.Join(signalEntered(), waitGate()); err != nil {
			return answer{}, err
		}
	case ModeProgress:
		ok.progress = []progressStep{{1, 2, "half"}, {2, 2, "done"}}
	}
	return ok, nil
}
