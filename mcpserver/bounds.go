package mcpserver

// Defaults of the request bounds.
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

// InFlight returns how many HTTP requests are in progress (holding a slot under
// Options.MaxInFlight and MaxInFlightTotal), over every token.
func (s *Server) InFlight() int {
	return s.inFlight.Total()
}
