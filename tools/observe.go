package tools

import (
	"strings"

	"github.com/toolfence/toolfence/interceptor"
)

// replayObservation is "[replayed] already done, outcome recorded at <RFC3339>: <cached
// output>"; the time is when the outcome was recorded (the commit, or a reconciler's or
// person's resolution), which can be later than the effect upstream; the cached output
// follows byte for byte. An empty output (a key resolved without a result) leaves the note alone.
func replayObservation(res *interceptor.Result) string {
	var b strings.Builder
	b.WriteString(interceptor.ReplayNote(res))
	if len(res.Output) == 0 {
		return b.String()
	}
	b.WriteString(": ")
	b.Write(res.Output)
	return b.String()
}

func (g *Guarded) upstream() string {
	if g.opts.upstream != "" {
		return g.opts.upstream
	}
	return "the upstream of " + g.Name()
}

// observe renders an error of Do as a plain-language observation for the model.
func (g *Guarded) observe(res *interceptor.Result, err error) string {
	return interceptor.Observe(g.Name(), g.upstream(), res, err)
}
