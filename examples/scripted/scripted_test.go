package scripted

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tmc/langchaingo/llms"
	lctools "github.com/tmc/langchaingo/tools"
)

// counter is a tool that answers "busy" until it has been called n times, then "done N".
type counter struct {
	n     int
	calls int
	seen  []string
}

func (c *counter) Name() string        { return "count" }
func (c *counter) Description() string { return "counts" }
func (c *counter) Call(_ context.Context, input string) (string, error) {
	c.calls++
	c.seen = append(c.seen, input)
	if c.calls < c.n {
		return fmt.Sprintf("busy %d", c.calls), nil
	}
	return fmt.Sprintf("done %d", c.calls), nil
}

func quiet(string, ...any) {}

func TestModelPlaysItsScriptThroughTheAgent(t *testing.T) {
	t.Parallel()
	tool := &counter{n: 1}
	var printed strings.Builder
	m := &Model{Printf: func(f string, a ...any) { fmt.Fprintf(&printed, f, a...) }, Steps: []Step{
		{Think: "counting", Tool: "count", Args: `{"x":1}`},
		{Expect: "done 1", Final: "counted"},
	}}
	answer, err := Run(t.Context(), m, []lctools.Tool{tool}, "count once")
	require.NoError(t, err)
	require.Equal(t, "counted", answer)
	require.Equal(t, []string{`{"x":1}`}, tool.seen)
	require.Equal(t, []string{"done 1"}, m.Answers())
	require.Equal(t, "  model: counting\n  model calls count {\"x\":1}\n  tool answered: done 1\n  model answers: counted\n", printed.String())
}

func TestModelGoesOffScript(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		steps []Step
		want  string
	}{
		"unexpected answer": {[]Step{{Tool: "count", Args: `{}`}, {Expect: "busy", Final: "x"}}, `expected a tool answer starting with "busy", got "done 1"`},
		"tool not offered":  {[]Step{{Tool: "nope", Args: `{}`}}, `calls "nope", which the agent does not offer`},
		"script exhausted":  {[]Step{{Tool: "count", Args: `{}`}}, "the script has no step 2"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := &Model{Printf: quiet, Steps: tc.steps}
			_, err := RunAgent(t.Context(), m, []lctools.Tool{&counter{n: 1}}, "go", 5)
			require.ErrorIs(t, err, ErrOffScript)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestPolicyReactsUntilDone: a policy repeats its reaction to "busy" as often as the tool
// answers it, with arguments derived from the answer.
func TestPolicyReactsUntilDone(t *testing.T) {
	t.Parallel()
	tool := &counter{n: 4}
	p := &Policy{Printf: quiet, Rules: []Rule{
		{Tool: "count", Args: `{"first":true}`},
		{When: "busy ", Tool: "count", ArgsFrom: func(answer string) (string, error) {
			return fmt.Sprintf(`{"after":%q}`, answer), nil
		}},
		{When: "done ", Final: "finished"},
	}}
	answer, err := RunAgent(t.Context(), p, []lctools.Tool{tool}, "count to four", 10)
	require.NoError(t, err)
	require.Equal(t, "finished", answer)
	require.Equal(t, []string{`{"first":true}`, `{"after":"busy 1"}`, `{"after":"busy 2"}`, `{"after":"busy 3"}`}, tool.seen)
	require.Equal(t, []string{"busy 1", "busy 2", "busy 3", "done 4"}, p.Answers())
	require.Equal(t, 5, p.Turns())
}

func TestPolicyGoesOffScript(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for name, tc := range map[string]struct {
		p    *Policy
		want string
	}{
		"no first rule":   {&Policy{Rules: []Rule{{When: "x", Final: "y"}}}, "no rule for the first turn"},
		"no reaction":     {&Policy{Rules: []Rule{{Tool: "count", Args: `{}`}}}, `turn 2: no rule reacts to the tool answer "busy 1"`},
		"max turns":       {&Policy{MaxTurns: 3, Rules: []Rule{{Tool: "count", Args: `{}`}, {When: "busy", Tool: "count", Args: `{}`}}}, "the policy played its 3 turns"},
		"args from fails": {&Policy{Rules: []Rule{{Tool: "count", Args: `{}`}, {When: "busy", Tool: "count", ArgsFrom: func(string) (string, error) { return "", boom }}}}, "boom"},
		"not offered":     {&Policy{Rules: []Rule{{Tool: "nope", Args: `{}`}}}, `turn 1 calls "nope", which the agent does not offer`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tc.p.Printf = quiet
			_, err := RunAgent(t.Context(), tc.p, []lctools.Tool{&counter{n: 100}}, "go", 50)
			require.ErrorIs(t, err, ErrOffScript)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestPolicyCall(t *testing.T) {
	t.Parallel()
	p := &Policy{Printf: quiet, Rules: []Rule{{Final: "hello"}}}
	out, err := p.Call(t.Context(), "hi")
	require.NoError(t, err)
	require.Equal(t, "hello", out)
	var _ llms.Model = p
}
