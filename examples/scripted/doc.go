// Package scripted is the offline model of the examples and the demo: llms.Models that play
// a fixed script (Model) or react to tool answers by fixed rules (Policy), as tool calls. It
// is public so that an example copied out of this repository still builds; it is a stand-in
// for a real model, not part of toolfence's API, and carries no compatibility promise.
//
// It imports langchaingo only; examples/agents, examples/mcp-proxy and cmd/toolfence/internal/demo import it.
package scripted
