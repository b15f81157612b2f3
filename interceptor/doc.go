// Package interceptor runs guarded tool calls through the ordering barrier of docs/design.md:
// reserve a durable pending residual, dispatch under a lease, classify, commit under the fence.
//
// It imports residual, lease and ledger; adapters (tools, mcpserver, httpguard) import it.
package interceptor
