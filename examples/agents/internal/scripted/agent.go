package scripted

import (
	"context"

	"github.com/tmc/langchaingo/agents"
	"github.com/tmc/langchaingo/chains"
	lctools "github.com/tmc/langchaingo/tools"
)

// Run runs one agent conversation the way a langchaingo program does: an
// OpenAIFunctionsAgent over model and tools, driven by an agents.Executor, on input. It
// returns the final answer, or the executor's error (a tool error, an off-script model).
func Run(ctx context.Context, model *Model, tools []lctools.Tool, input string) (string, error) {
	agent := agents.NewOpenAIFunctionsAgent(model, tools)
	exec := agents.NewExecutor(agent, agents.WithMaxIterations(len(model.Steps)+1))
	return chains.Run(ctx, exec, input)
}
