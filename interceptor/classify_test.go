package interceptor_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
)

func TestDefaultClassifier(t *testing.T) {
	t.Parallel()
	noEffect := interceptor.NoEffect(errors.New("validation failed"))
	resp := func(status int, body string) interceptor.Response {
		return interceptor.Response{Status: status, Body: []byte(body)}
	}
	claim := func(status int, body string, s residual.State) interceptor.Response {
		r := resp(status, body)
		r.Outcome = s
		return r
	}
	for _, c := range []struct {
		name string
		resp interceptor.Response
		err  error
		want residual.State
	}{
		// Errors: unknown unless they prove no effect.
		{"plain error", interceptor.Response{}, errors.New("boom"), residual.Unknown},
		{"deadline", interceptor.Response{}, context.DeadlineExceeded, residual.Unknown},
		{"canceled", interceptor.Response{}, context.Canceled, residual.Unknown},
		{"error with 200", resp(200, `{}`), errors.New("boom"), residual.Unknown},
		{"error with a success claim", claim(200, `{}`, residual.Succeeded), errors.New("boom"), residual.Unknown},
		{"no effect", interceptor.Response{}, noEffect, residual.Failed},
		{"no effect wrapped again", interceptor.Response{}, fmt.Errorf("charge: %w", noEffect), residual.Failed},
		{"no effect sentinel", interceptor.Response{}, interceptor.ErrNoEffect, residual.Failed},
		{"no effect with 500", resp(500, ``), noEffect, residual.Failed},
		// Queued answers are accepted whatever is claimed.
		{"202", resp(202, ``), nil, residual.Accepted},
		{"202 with a body", resp(202, `{"id":"job-1"}`), nil, residual.Accepted},
		{"202 claiming success", claim(202, ``, residual.Succeeded), nil, residual.Accepted},
		{"queued body", resp(200, `{"status":"queued"}`), nil, residual.Accepted},
		{"queued body claiming success", claim(200, `{"status":"queued"}`, residual.Succeeded), nil, residual.Accepted},
		{"state processing", resp(201, `{"state":"processing"}`), nil, residual.Accepted},
		{"queued body without status", resp(0, `{"status":"pending"}`), nil, residual.Accepted},
		// Explicit outcomes.
		{"claims failed", claim(200, `{}`, residual.Failed), nil, residual.Failed},
		{"claims unknown", claim(200, `{}`, residual.Unknown), nil, residual.Unknown},
		{"claims accepted", claim(200, `{}`, residual.Accepted), nil, residual.Accepted},
		{"claims succeeded on 500", claim(500, `{}`, residual.Succeeded), nil, residual.Succeeded},
		// HTTP status.
		{"no status", resp(0, `{"ok":true}`), nil, residual.Succeeded},
		{"200", resp(200, `{"status":"succeeded"}`), nil, residual.Succeeded},
		{"201", resp(201, `{}`), nil, residual.Succeeded},
		{"204", resp(204, ``), nil, residual.Succeeded},
		{"200 nested queued", resp(200, `{"data":{"status":"queued"}}`), nil, residual.Succeeded},
		{"400", resp(400, `{}`), nil, residual.Failed},
		{"401", resp(401, `{}`), nil, residual.Failed},
		{"403", resp(403, `{}`), nil, residual.Failed},
		{"404", resp(404, `{}`), nil, residual.Failed},
		{"422", resp(422, `{}`), nil, residual.Failed},
		{"302", resp(302, ``), nil, residual.Unknown},
		{"408", resp(408, ``), nil, residual.Unknown},
		{"409", resp(409, ``), nil, residual.Unknown},
		{"425", resp(425, ``), nil, residual.Unknown},
		{"429", resp(429, ``), nil, residual.Unknown},
		{"500", resp(500, ``), nil, residual.Unknown},
		{"502", resp(502, ``), nil, residual.Unknown},
		{"503", resp(503, ``), nil, residual.Unknown},
		{"504", resp(504, ``), nil, residual.Unknown},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, interceptor.DefaultClassifier(c.resp, c.err))
		})
	}
}

// StatusOutcome is the table DefaultClassifier and tools.Transport classify statuses by.
func TestStatusOutcome(t *testing.T) {
	t.Parallel()
	table := map[int]residual.State{
		200: residual.Succeeded, 201: residual.Succeeded, 204: residual.Succeeded, 206: residual.Succeeded,
		202: residual.Accepted,
		400: residual.Failed, 401: residual.Failed, 403: residual.Failed, 404: residual.Failed, 422: residual.Failed,
		408: residual.Unknown, 409: residual.Unknown, 425: residual.Unknown, 429: residual.Unknown,
		500: residual.Unknown, 502: residual.Unknown, 503: residual.Unknown, 504: residual.Unknown,
		301: residual.Unknown, 304: residual.Unknown, 405: residual.Unknown, 410: residual.Unknown, 100: residual.Unknown,
	}
	for status, want := range table {
		require.Equal(t, want, interceptor.StatusOutcome(status), "status %d", status)
	}
}

func TestQueued(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status int
		body   string
		want   bool
	}{
		{202, ``, true},
		{202, `{"status":"done"}`, true},
		{200, `{"status":"queued"}`, true},
		{200, `{"status":"accepted"}`, true},
		{200, `{"status":"pending"}`, true},
		{200, `{"status":"processing"}`, true},
		{200, `{"status":"in_progress"}`, true},
		{200, `{"status":"in-progress"}`, true},
		{200, `{"status":"scheduled"}`, true},
		{200, `{"status":"running"}`, true},
		{200, `{"status":"submitted"}`, true},
		{200, `{"state":"queued"}`, true},
		{200, `{"status":"QUEUED"}`, true},
		{200, ` { "status" : " Running " } `, true},
		{200, "\n{\"id\":1,\"status\":\"queued\"}\n", true},
		{200, `{"status":"succeeded","state":"queued"}`, true},
		{0, `{"status":"queued"}`, true},
		{200, ``, false},
		{200, `{}`, false},
		{200, `{"status":"succeeded"}`, false},
		{200, `{"status":"done"}`, false},
		{200, `{"status":"failed"}`, false},
		{200, `{"status":1}`, false},
		{200, `{"status":null}`, false},
		{200, `{"status":["queued"]}`, false},
		{200, `{"data":{"status":"queued"}}`, false},
		{200, `[{"status":"queued"}]`, false},
		{200, `"queued"`, false},
		{200, `queued`, false},
		{200, `{"status":"queued"`, false},
		{200, `{"message":"your request is queued"}`, false},
		{201, `{"id":"x"}`, false},
		{204, ``, false},
		{500, ``, false},
	} {
		t.Run(fmt.Sprintf("%d %s", c.status, c.body), func(t *testing.T) {
			require.Equal(t, c.want, interceptor.Queued(c.status, []byte(c.body)))
		})
	}
}

func TestNoEffect(t *testing.T) {
	t.Parallel()
	require.NoError(t, interceptor.NoEffect(nil))
	base := errors.New("amount must be positive")
	err := interceptor.NoEffect(base)
	require.ErrorIs(t, err, interceptor.ErrNoEffect)
	require.ErrorIs(t, err, base)
	require.Contains(t, err.Error(), "amount must be positive")
}

// Per-operation classifiers override the default, but can never record an erring call or a
// queued answer as a success, and anything but the four commit outcomes counts as unknown.
func TestOperationClassifier(t *testing.T) {
	t.Parallel()
	const op = "tickets.open"
	for _, c := range []struct {
		name     string
		classify interceptor.Classifier
		resp     interceptor.Response
		err      error
		want     residual.State
	}{
		{"409 means it exists: failed", func(r interceptor.Response, err error) residual.State {
			if r.Status == 409 {
				return residual.Failed
			}
			return interceptor.DefaultClassifier(r, err)
		}, interceptor.Response{Status: 409}, nil, residual.Failed},
		{"500 overridden as succeeded", func(interceptor.Response, error) residual.State { return residual.Succeeded },
			interceptor.Response{Status: 500, Body: []byte(`{}`)}, nil, residual.Succeeded},
		{"success claimed with an error", func(interceptor.Response, error) residual.State { return residual.Succeeded },
			interceptor.Response{Status: 200}, errors.New("timeout"), residual.Unknown},
		{"success claimed for 202", func(interceptor.Response, error) residual.State { return residual.Succeeded },
			interceptor.Response{Status: 202, Handle: "h"}, nil, residual.Accepted},
		{"pending is not an outcome", func(interceptor.Response, error) residual.State { return residual.Pending },
			interceptor.Response{Status: 200}, nil, residual.Unknown},
		{"none is not an outcome", func(interceptor.Response, error) residual.State { return residual.None },
			interceptor.Response{Status: 200}, nil, residual.Unknown},
		{"garbage is not an outcome", func(interceptor.Response, error) residual.State { return "done" },
			interceptor.Response{Status: 200}, nil, residual.Unknown},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, withConfig(func(cfg *interceptor.Options) {
				cfg.Operations = map[string]interceptor.Operation{op: {Classify: c.classify}}
			}))
			call := interceptor.Call{Operation: op, Target: "ticket:1"}
			_, _ = f.ic.Do(f.ctx, call, answering(c.resp, c.err).fn)
			require.Equal(t, c.want, f.get(f.key(op, "ticket:1")).State)

			// Other operations keep the default classifier.
			other := interceptor.Call{Operation: "tickets.close", Target: "ticket:1"}
			_, _ = f.ic.Do(f.ctx, other, answering(interceptor.Response{Status: 409}, nil).fn)
			require.Equal(t, residual.Unknown, f.get(f.key(other.Operation, other.Target)).State)
		})
	}
}

// Options.Classifier replaces the default for every operation without its own.
func TestConfigClassifier(t *testing.T) {
	t.Parallel()
	f := setup(t, withConfig(func(c *interceptor.Options) {
		c.Classifier = func(r interceptor.Response, err error) residual.State {
			if r.Status == 503 {
				return residual.Failed // this upstream sheds load before doing anything
			}
			return interceptor.DefaultClassifier(r, err)
		}
	}))
	tl := answering(interceptor.Response{Status: 503}, nil)
	res, err := f.ic.Do(f.ctx, charge(chargeArgs), tl.fn)
	require.ErrorIs(t, err, interceptor.ErrCallFailed)
	require.Equal(t, residual.Failed, res.State)
	require.Contains(t, err.Error(), "503")
}
