package mcpwire

import "time"

// Path is where both surfaces serve their MCP endpoint over HTTP.
const Path = "/mcp"

// Defaults of the request bounds of both HTTP surfaces.
const (
	// DefaultMaxDepth caps how deeply a request's JSON nests objects and arrays.
	DefaultMaxDepth = 64
	// DefaultMaxValues caps the objects, arrays and elements in one request's JSON.
	DefaultMaxValues = 20_000
	// DefaultMaxInFlight caps the requests one token has in progress at once.
	DefaultMaxInFlight = 16
	// DefaultMaxInFlightTotal caps the requests in progress at once over all tokens.
	DefaultMaxInFlightTotal = 32
)

// Defaults of the session limits of both HTTP surfaces.
const (
	// DefaultSessionIdle ends an HTTP session after this long without a request.
	DefaultSessionIdle = 30 * time.Minute
	// DefaultMaxSessions caps the HTTP sessions one token holds at once.
	DefaultMaxSessions = 64
	// DefaultChildIdle ends a proxy session whose upstream is a child process of its own
	// (toolfence proxy --http -- CMD) after this long without a request: a child holds
	// tens of megabytes (docs/limits.md, "Memory per host session").
	DefaultChildIdle = 5 * time.Minute
	// DefaultMaxChildren caps the proxy sessions that hold a child process of their own at
	// once, over all tokens.
	DefaultMaxChildren = 16
)
