package scripted

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/tmc/langchaingo/llms"
)

// Step is one turn of the script: a tool call (Tool and Args) or, when Tool is empty, the
// final answer.
type Step struct {
	// Expect, when set, must be a prefix of the last tool answer the model received before
	// this step; otherwise the model fails the run (the story went off script).
	Expect string
	// Think is printed when the step is played, as the model's reasoning.
	Think string
	// Tool and Args make a tool call; Args is the JSON arguments.
	Tool string
	Args string
	// Final is the final answer when Tool is empty.
	Final string
}

// ErrOffScript is wrapped by GenerateContent's error when the script is exhausted, a tool
// answer does not match Step.Expect, or the called tool is not offered to the model.
var ErrOffScript = errors.New("scripted: off script")

// Model is an llms.Model that returns the steps of its script in order, as the tool calls
// langchaingo's OpenAIFunctionsAgent parses (ContentChoice.ToolCalls). It prints each tool
// answer it receives and each step it plays through Printf. It is safe for concurrent use,
// though a script is meant for one run.
type Model struct {
	Steps []Step
	// Printf prints the story. Defaults to fmt.Printf.
	Printf func(format string, args ...any)

	mu      sync.Mutex
	next    int
	seen    int
	answers []string
}

var _ llms.Model = (*Model)(nil)

// GenerateContent plays the next step. It returns an error wrapping ErrOffScript when the
// script is exhausted, when the last tool answer does not start with the step's Expect, or
// when the step's tool is not among the functions or tools offered.
func (m *Model) GenerateContent(_ context.Context, messages []llms.MessageContent, options ...llms.CallOption) (*llms.ContentResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	printf := m.Printf
	if printf == nil {
		printf = func(format string, args ...any) { fmt.Printf(format, args...) }
	}
	answers := toolAnswers(messages)
	for _, a := range answers[min(m.seen, len(answers)):] {
		printf("  tool answered: %s\n", a)
		m.answers = append(m.answers, a)
	}
	m.seen = len(answers)

	if m.next >= len(m.Steps) {
		return nil, fmt.Errorf("%w: the script has no step %d", ErrOffScript, m.next+1)
	}
	step := m.Steps[m.next]
	m.next++
	if step.Expect != "" {
		last := ""
		if len(answers) > 0 {
			last = answers[len(answers)-1]
		}
		if !strings.HasPrefix(last, step.Expect) {
			return nil, fmt.Errorf("%w: step %d expected a tool answer starting with %q, got %q", ErrOffScript, m.next, step.Expect, last)
		}
	}
	if step.Think != "" {
		printf("  model: %s\n", step.Think)
	}
	if step.Tool == "" {
		printf("  model answers: %s\n", step.Final)
		return &llms.ContentResponse{Choices: []*llms.ContentChoice{{Content: step.Final, StopReason: "stop"}}}, nil
	}
	if !offered(step.Tool, options) {
		return nil, fmt.Errorf("%w: step %d calls %q, which the agent does not offer", ErrOffScript, m.next, step.Tool)
	}
	printf("  model calls %s %s\n", step.Tool, step.Args)
	return toolCallResponse(fmt.Sprintf("call_%d", m.next), step.Tool, step.Args), nil
}

// Call answers a single prompt through GenerateContent.
func (m *Model) Call(ctx context.Context, prompt string, options ...llms.CallOption) (string, error) {
	return llms.GenerateFromSinglePrompt(ctx, m, prompt, options...)
}

// Answers returns every tool answer the model has received, in order.
func (m *Model) Answers() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.answers)
}

func offered(name string, options []llms.CallOption) bool {
	var o llms.CallOptions
	for _, opt := range options {
		opt(&o)
	}
	for _, f := range o.Functions {
		if f.Name == name {
			return true
		}
	}
	for _, t := range o.Tools {
		if t.Function != nil && t.Function.Name == name {
			return true
		}
	}
	return false
}
