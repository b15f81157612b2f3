package mcpserver

// InFlight returns how many HTTP requests are in progress (holding a slot under
// Options.MaxInFlight and MaxInFlightTotal), over every token.
func (s *Server) InFlight() int {
	return s.inFlight.Total()
}
