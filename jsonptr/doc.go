// Package jsonptr evaluates RFC 6901 JSON pointers on a call's JSON input and extracts a
// call's target from the values they name, by one rule for every surface (tools, mcpproxy).
//
// It imports residual (canonical JSON) only.
package jsonptr
