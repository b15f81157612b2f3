package mcpproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/residual"
)

// MCP tasks come in two generations, and a protected call answered with a task is recorded
// accepted (never succeeded) with a handle naming the task:
//   - 2025-11-25 Tasks: the call's result holds {"task": {"taskId": …}}; the proxy asks
//     tasks/get for the status and tasks/result for the result, in the revision of the
//     session that began it (no 2026 _meta: a server refuses tasks/result in 2026-07-28).
//   - the tasks extension of 2026-07-28 (io.modelcontextprotocol/tasks, SEP-2663): the
//     result is a flat CreateTaskResult, resultType "task" and taskId, ttlMs and
//     pollIntervalMs at its top; tasks/get answers the task with its result inlined once it
//     is completed (there is no tasks/result); a task that ends "completed" with an isError
//     result is a tool error (unknown unless a no_effect rule says otherwise), never a
//     success; "failed" is a protocol error (it proves nothing). Requests about a task carry
//     Mcp-Name: <taskId> over HTTP (the transport sets it).

// taskHandle names a task in the handle of an accepted residual: "<scope>/<taskId>" for a
// 2025-11-25 task, "<scope>+tasks/<taskId>" for a flat 2026-07-28 one. The scope is the
// upstream session (or stateless server) whose task ids it is (session.handleScope): only
// there is the task asked about.
type taskHandle struct {
	scope, id string
	flat      bool // the 2026-07-28 tasks extension
}

// flatSuffix marks the scope of a 2026-07-28 task's handle.
const flatSuffix = "+tasks"

func (h taskHandle) String() string {
	if h.flat {
		return h.scope + flatSuffix + "/" + h.id
	}
	return h.scope + "/" + h.id
}

// parseTaskHandle reads a handle taskHandle.String wrote; ok is false for any other.
func parseTaskHandle(s string) (taskHandle, bool) {
	scope, id, ok := strings.Cut(s, "/")
	if !ok || scope == "" || id == "" {
		return taskHandle{}, false
	}
	h := taskHandle{scope: scope, id: id}
	if base, flat := strings.CutSuffix(scope, flatSuffix); flat {
		h.scope, h.flat = base, true
	}
	return h, true
}

// taskOutcome asks upstream what became of the task h names (see the generations above).
// Completed with a result that is not an error → succeeded (its result recorded); completed
// or failed with an isError result that matches a no_effect pattern → failed; working or
// input_required → open; failed or cancelled otherwise → open (nothing proves it had no
// effect: a person checks upstream and resolves); a JSON-RPC error (such as an unknown or
// expired task id) → open. A 2026-07-28 task is not asked about again sooner than its
// pollIntervalMs after the last time.
func (s *session) taskOutcome(ctx context.Context, h taskHandle, rule policy.Rule) settlement {
	open := func(format string, a ...any) settlement {
		return settlement{outcome: residual.Unknown, evidence: fmt.Sprintf("tasks/get %s: ", h.id) + fmt.Sprintf(format, a...)}
	}
	if wait := s.p.polls.wait(h.String(), s.p.clock().Now()); wait > 0 {
		return open("asked less than its pollIntervalMs ago; upstream asks to wait %v more before asking again", wait.Round(time.Millisecond))
	}
	params, _ := json.Marshal(map[string]string{"taskId": h.id})
	ask := func(method string) (*jsonrpc.Response, error) {
		if h.flat {
			return s.roundTrip(ctx, method, params) // in the stateless revision, Mcp-Name: taskId
		}
		return s.roundTripFor(ctx, "", method, params) // in the session's own revision
	}
	resp, err := ask("tasks/get")
	if err != nil {
		return open("no answer: %v", err)
	}
	if resp.Error != nil {
		return open("JSON-RPC error: %v (a task past its ttlMs is forgotten upstream: check upstream, then toolfence resolve)", resp.Error)
	}
	var task struct {
		TaskID         string          `json:"taskId"`
		Status         string          `json:"status"`
		StatusMessage  string          `json:"statusMessage"`
		Result         json.RawMessage `json:"result"`
		Error          json.RawMessage `json:"error"`
		PollIntervalMs int64           `json:"pollIntervalMs"`
	}
	if err := json.Unmarshal(resp.Result, &task); err != nil || task.Status == "" {
		return open("the answer is not a task: %s", truncate(string(resp.Result), 200))
	}
	if task.TaskID != h.id {
		return open("the answer is about task %q, not this one: check upstream, then toolfence resolve", task.TaskID)
	}
	if h.flat && task.PollIntervalMs > 0 {
		s.p.polls.asked(h.String(), s.p.clock().Now(), time.Duration(task.PollIntervalMs)*time.Millisecond)
	}
	msg := ""
	if task.StatusMessage != "" {
		msg = " (" + task.StatusMessage + ")"
	}
	switch task.Status {
	case "working", "input_required":
		return open("the task is still %s upstream%s", task.Status, msg)
	case "completed", "failed":
	case "cancelled":
		return open("the task was cancelled upstream%s; nothing proves it had no effect: check upstream, then toolfence resolve", msg)
	default:
		return open("unknown task status %q%s", task.Status, msg)
	}
	result, from := task.Result, "its result"
	if h.flat {
		if task.Status == "failed" {
			return open("the task failed with a protocol error%s (%s); nothing proves it had no effect: check upstream, then toolfence resolve",
				msg, truncate(cmpStr(string(task.Error), "no error given"), 200))
		}
		if len(result) == 0 || string(result) == "null" {
			return open("the task is completed%s but tasks/get gave no result: check upstream, then toolfence resolve", msg)
		}
	} else {
		r, err := ask("tasks/result")
		if err != nil {
			return open("the task is %s%s, but tasks/result gave no answer: %v", task.Status, msg, err)
		}
		if r.Error != nil {
			return open("the task is %s%s, but tasks/result answered a JSON-RPC error: %v", task.Status, msg, r.Error)
		}
		result, from = r.Result, "tasks/result"
	}
	rep := classify(rule.NoEffect, &jsonrpc.Response{Result: result}, nil)
	switch {
	case task.Status == "completed" && rep.Outcome == residual.Succeeded:
		return settlement{outcome: residual.Succeeded, result: result,
			evidence: fmt.Sprintf("tasks/get %s: completed%s; %s is not an error: the effect happened (its result is recorded)", h.id, msg, from)}
	case rep.Outcome == residual.Failed:
		return settlement{outcome: residual.Failed,
			evidence: fmt.Sprintf("tasks/get %s: %s%s; %s matches a no_effect rule: %s", h.id, task.Status, msg, from, rep.Error)}
	}
	return open("the task is %s%s and %s does not prove it had no effect (%s): check upstream, then toolfence resolve",
		task.Status, msg, from, truncate(cmpStr(rep.Error, string(result)), 200))
}

// polls remembers when each 2026-07-28 task may be asked about again (its pollIntervalMs
// after the last tasks/get), for at most maxPolls tasks.
type polls struct {
	mu   sync.Mutex
	next map[string]time.Time
}

const maxPolls = 4096

// wait is how long to wait before asking about handle again (0: ask now).
func (p *polls) wait(handle string, now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if at, ok := p.next[handle]; ok && now.Before(at) {
		return at.Sub(now)
	}
	delete(p.next, handle)
	return 0
}

// asked records that handle was asked about at now and may be again after every.
func (p *polls) asked(handle string, now time.Time, every time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.next == nil {
		p.next = map[string]time.Time{}
	}
	if len(p.next) >= maxPolls {
		for h, at := range p.next {
			if !now.Before(at) {
				delete(p.next, h)
			}
		}
		if len(p.next) >= maxPolls {
			return // full of tasks not yet due: ask without waiting rather than grow
		}
	}
	p.next[handle] = now.Add(every)
}
