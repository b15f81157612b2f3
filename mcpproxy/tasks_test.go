package mcpproxy_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/residual"
)

// createTask is a 2026-07-28 tasks-extension CreateTaskResult (flat, resultType "task").
const createTask = `{"resultType":"task","taskId":"t-1","status":"working","createdAt":"2026-12-07T09:00:00Z",` +
	`"lastUpdatedAt":"2026-12-07T09:00:00Z","ttlMs":60000,"pollIntervalMs":5000}`

// taskRig is a rig on a fake clock whose host speaks 2026-07-28 and whose call of charge was
// answered with a task: recorded accepted.
func taskRig(t *testing.T) (*rig, *lease.Fake) {
	t.Helper()
	clock := lease.NewFake(time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC))
	r := newRig(t, mcpproxy.Options{}, clock)
	r.callCharge(t, 1)
	r.discovered(t)
	r.listed(t, chargeDef)
	r.up.answer(t, r.up.nextReq(t).ID, createTask)
	first := r.hostResult(t, 1)
	require.Contains(t, first, "awaiting_upstream", "a task is accepted, never a success")
	require.Equal(t, residual.Accepted, r.residuals(t)[0].State)
	require.True(t, strings.HasSuffix(r.residuals(t)[0].Handle, "+tasks/t-1"), r.residuals(t)[0].Handle)
	return r, clock
}

func (r *rig) callCharge(t *testing.T, id float64) {
	r.host.send(t, id, "tools/call", `{"name":"charge","arguments":{"order":"A"},`+meta2026+`}`)
}

// taskGot answers the proxy's tasks/get about t-1 with the task detailed (status, and the
// inlined result or error) and checks it asked in the stateless revision.
func (r *rig) taskGot(t *testing.T, detail string) {
	t.Helper()
	get := r.up.nextReq(t)
	require.Equal(t, "tasks/get", get.Method)
	var p struct {
		TaskID string                     `json:"taskId"`
		Meta   map[string]json.RawMessage `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(get.Params, &p))
	require.Equal(t, "t-1", p.TaskID)
	require.JSONEq(t, `"2026-07-28"`, string(p.Meta["io.modelcontextprotocol/protocolVersion"]))
	r.up.answer(t, get.ID, `{"resultType":"complete","taskId":"t-1",`+detail+`}`)
}

// A 2026-07-28 task completed with a result that is not an error settles the call as
// succeeded: tasks/get inlines the result, there is no tasks/result, and the call replays it.
func TestProxyTasksExtensionCompleted(t *testing.T) {
	r, _ := taskRig(t)
	r.callCharge(t, 2)
	r.taskGot(t, `"status":"completed","result":{"resultType":"complete","content":[{"type":"text","text":"charged A by task"}]}`)
	replay := r.hostResult(t, 2)
	require.Contains(t, replay, "[replayed]")
	require.Contains(t, replay, "charged A by task")
	require.Equal(t, residual.Succeeded, r.residuals(t)[0].State)
}

// A task that ended "completed" with an isError result is a tool error, not a success: the
// key stays open (nothing proves it had no effect), and "failed" (a protocol error) proves
// nothing either.
func TestProxyTasksExtensionErrorsAreNotSuccess(t *testing.T) {
	for name, detail := range map[string]string{
		"completed isError": `"status":"completed","result":{"resultType":"complete","isError":true,"content":[{"type":"text","text":"card declined halfway"}]}`,
		"failed":            `"status":"failed","error":{"code":-32603,"message":"worker crashed"}`,
	} {
		t.Run(name, func(t *testing.T) {
			r, _ := taskRig(t)
			r.callCharge(t, 2)
			r.taskGot(t, detail)
			answer := r.hostResult(t, 2)
			require.Contains(t, answer, "awaiting_upstream")
			require.Contains(t, answer, "tasks/get t-1")
			require.Equal(t, residual.Accepted, r.residuals(t)[0].State, "never succeeded")
		})
	}
}

// The proxy asks about a 2026-07-28 task no sooner than its pollIntervalMs after the last
// tasks/get: a call before then says how long to wait and sends nothing.
func TestProxyTasksExtensionHonoursPollInterval(t *testing.T) {
	r, clock := taskRig(t)
	r.callCharge(t, 2)
	r.taskGot(t, `"status":"working","pollIntervalMs":5000`)
	require.Contains(t, r.hostResult(t, 2), "still working")
	r.callCharge(t, 3)
	third := r.hostResult(t, 3)
	require.Contains(t, third, "pollIntervalMs")
	r.nothingSentUpstream(t, 4)
	clock.Advance(5 * time.Second)
	r.callCharge(t, 5)
	r.taskGot(t, `"status":"completed","result":{"content":[{"type":"text","text":"charged A by task"}]}`)
	require.Contains(t, r.hostResult(t, 5), "charged A by task")
}
