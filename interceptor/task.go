package interceptor

import "context"

type taskKey struct{}

// WithTask returns a context carrying the task: the unit of work (agent run, job,
// conversation) that must not repeat an effect and that a successor inherits.
func WithTask(ctx context.Context, task string) context.Context {
	return context.WithValue(ctx, taskKey{}, task)
}

// TaskFrom returns the task carried by ctx and whether a non-empty one was set.
func TaskFrom(ctx context.Context) (string, bool) {
	t, _ := ctx.Value(taskKey{}).(string)
	return t, t != ""
}
