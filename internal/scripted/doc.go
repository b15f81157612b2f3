// Package scripted is the offline model of the examples and the demo: llms.Models that play
// a fixed script (Model) or react to tool answers by fixed rules (Policy), as tool calls.
//
// It imports langchaingo only; examples/agents and internal/demo import it.
package scripted
