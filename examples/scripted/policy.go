package scripted

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/tmc/langchaingo/llms"
)

// DefaultMaxTurns is Policy.MaxTurns when it is zero.
const DefaultMaxTurns = 20

// Rule is one reaction of a Policy: a tool call (Tool with Args or ArgsFrom) or, when Tool is
// empty, the final answer.
type Rule struct {
	// When is a prefix of the last tool answer this rule reacts to. Empty matches only the
	// first turn, before any tool has answered.
	When string
	// Think is printed when the rule is played, as the model's reasoning.
	Think string
	// Tool and Args make a tool call; Args is the JSON arguments.
	Tool string
	Args string
	// ArgsFrom, when set, derives the JSON arguments from the last tool answer instead of
	// Args (for example a wait computed from "check again in 1.2s"). Its error ends the run
	// as off script.
	ArgsFrom func(answer string) (string, error)
	// Final is the final answer when Tool is empty.
	Final string
}

// Policy is an llms.Model that reacts to the last tool answer by the first rule whose When
// matches it, so a story whose answers repeat (a call that is still in progress, then in
// progress again) needs no fixed length. It returns tool calls the way langchaingo's
// OpenAIFunctionsAgent parses them, and prints each tool answer and each reaction through
// Printf. It is safe for concurrent use, though a policy is meant for one run.
type Policy struct {
	Rules []Rule
	// MaxTurns caps the number of turns (model calls) of a run. Defaults to DefaultMaxTurns.
	MaxTurns int
	// Printf prints the story. Defaults to fmt.Printf.
	Printf func(format string, args ...any)

	mu      sync.Mutex
	turns   int
	seen    int
	answers []string
}

var _ llms.Model = (*Policy)(nil)

// GenerateContent plays the rule that matches the last tool answer. It returns an error
// wrapping ErrOffScript when no rule matches, when MaxTurns turns have been played, when a
// rule's ArgsFrom fails, or when the rule's tool is not among the functions or tools offered.
func (p *Policy) GenerateContent(_ context.Context, messages []llms.MessageContent, options ...llms.CallOption) (*llms.ContentResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	printf := p.Printf
	if printf == nil {
		printf = func(format string, args ...any) { fmt.Printf(format, args...) }
	}
	answers := toolAnswers(messages)
	for _, a := range answers[min(p.seen, len(answers)):] {
		printf("  tool answered: %s\n", a)
		p.answers = append(p.answers, a)
	}
	p.seen = len(answers)

	maxTurns := p.MaxTurns
	if maxTurns <= 0 {
		maxTurns = DefaultMaxTurns
	}
	if p.turns >= maxTurns {
		return nil, fmt.Errorf("%w: the policy played its %d turns", ErrOffScript, maxTurns)
	}
	p.turns++
	first, last := len(answers) == 0, ""
	if !first {
		last = answers[len(answers)-1]
	}
	i := slices.IndexFunc(p.Rules, func(r Rule) bool {
		if r.When == "" {
			return first
		}
		return !first && strings.HasPrefix(last, r.When)
	})
	if i < 0 {
		if first {
			return nil, fmt.Errorf("%w: no rule for the first turn", ErrOffScript)
		}
		return nil, fmt.Errorf("%w: turn %d: no rule reacts to the tool answer %q", ErrOffScript, p.turns, last)
	}
	rule := p.Rules[i]
	if rule.Think != "" {
		printf("  model: %s\n", rule.Think)
	}
	if rule.Tool == "" {
		printf("  model answers: %s\n", rule.Final)
		return &llms.ContentResponse{Choices: []*llms.ContentChoice{{Content: rule.Final, StopReason: "stop"}}}, nil
	}
	if !offered(rule.Tool, options) {
		return nil, fmt.Errorf("%w: turn %d calls %q, which the agent does not offer", ErrOffScript, p.turns, rule.Tool)
	}
	args := rule.Args
	if rule.ArgsFrom != nil {
		var err error
		if args, err = rule.ArgsFrom(last); err != nil {
			return nil, fmt.Errorf("%w: turn %d: arguments for %s from %q: %w", ErrOffScript, p.turns, rule.Tool, last, err)
		}
	}
	printf("  model calls %s %s\n", rule.Tool, args)
	return toolCallResponse(fmt.Sprintf("call_%d", p.turns), rule.Tool, args), nil
}

// Call answers a single prompt through GenerateContent.
func (p *Policy) Call(ctx context.Context, prompt string, options ...llms.CallOption) (string, error) {
	return llms.GenerateFromSinglePrompt(ctx, p, prompt, options...)
}

// Answers returns every tool answer the policy has received, in order.
func (p *Policy) Answers() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.answers)
}

// Turns returns how many turns the policy has played.
func (p *Policy) Turns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.turns
}

// toolAnswers returns the contents of the tool answers in messages, in order.
func toolAnswers(messages []llms.MessageContent) []string {
	var answers []string
	for _, msg := range messages {
		for _, part := range msg.Parts {
			if r, ok := part.(llms.ToolCallResponse); ok {
				answers = append(answers, r.Content)
			}
		}
	}
	return answers
}

// toolCallResponse is a response that calls tool with the JSON args.
func toolCallResponse(id, tool, args string) *llms.ContentResponse {
	call := llms.ToolCall{ID: id, Type: "function", FunctionCall: &llms.FunctionCall{Name: tool, Arguments: args}}
	return &llms.ContentResponse{Choices: []*llms.ContentChoice{{ToolCalls: []llms.ToolCall{call}, StopReason: "tool_calls"}}}
}
