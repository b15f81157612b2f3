package mcpwire

// Keys of toolfence in MCP _meta objects.
const (
	// MetaTask is the request _meta field (a string) that names the task of a tools/call.
	MetaTask = "toolfence.dev/task"
	// MetaReplayed is true in the _meta of a replayed result.
	MetaReplayed = "toolfence.dev/replayed"
	// MetaCall holds the key, attempt, token and recorded time of a replayed result.
	MetaCall = "toolfence.dev/call"
	// MetaError holds the structured details (ErrorInfo) of an isError result toolfence
	// made: a violation, a refused input or policy, an unknown outcome.
	MetaError = "toolfence.dev/error"
)
