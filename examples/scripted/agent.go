package scripted

import (
	"context"

	"github.com/tmc/langchaingo/agents"
	"github.com/tmc/langchaingo/chains"
	"github.com/tmc/langchaingo/llms"
	lctools "github.com/tmc/langchaingo/tools"
)

// Run runs one agent conversation the way a langchaingo program does: an
// OpenAIFunctionsAgent over model and tools, driven by an agents.Executor, on input. It
// returns the final answer, or the executor's error (a tool error, an off-script model).
func Run(ctx context.Context, model *Model, tools []lctools.Tool, input string) (string, error) {
	return RunAgent(ctx, model, tools, input, len(model.Steps)+1)
}

// RunAgent is Run for any model (a Policy, or a real LLM): an OpenAIFunctionsAgent over model
// and tools, driven by an agents.Executor that allows at most maxIterations tool calls. It
// returns the final answer, or the executor's error (a tool error, an off-script model, too
// many iterations).
func RunAgent(ctx context.Context, model llms.Model, tools []lctools.Tool, input string, maxIterations int) (string, error) {
	agent := agents.NewOpenAIFunctionsAgent(model, tools)
	exec := agents.NewExecutor(agent, agents.WithMaxIterations(maxIterations))
	return chains.Run(ctx, exec, input)
}
