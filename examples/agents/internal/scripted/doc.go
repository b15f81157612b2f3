// Package scripted is the offline model of the examples: an llms.Model that plays a fixed
// script of tool calls and answers, and checks what the tools answered along the way.
//
// It imports langchaingo only; the examples under examples/agents import it.
package scripted
