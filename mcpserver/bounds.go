package mcpserver

import (
	"fmt"
	"sync"
)

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

// checkShape refuses JSON that nests deeper than maxDepth or holds more than maxValues
// objects, arrays and elements (each '{', '[' and ',' outside strings counts one), before
// anything is decoded: decoding materialises every value, at up to ~100 bytes for an
// empty object written in 3. It does not validate the JSON; the decoder does that after.
func checkShape(body []byte, maxDepth, maxValues int) error {
	depth, values := 0, 0
	inString, escaped := false, false
	for _, c := range body {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			if depth++; depth > maxDepth {
				return fmt.Errorf("the request's JSON nests more than %d levels deep", maxDepth)
			}
			values++
		case '}', ']':
			depth--
		case ',':
			values++
		default:
			continue
		}
		if values > maxValues {
			return fmt.Errorf("the request's JSON holds more than %d values (objects, arrays and elements)", maxValues)
		}
	}
	return nil
}

// inFlight counts the requests in progress, per owner and in all.
type inFlight struct {
	mu      sync.Mutex
	byOwner map[string]int
	total   int
}

// acquire takes a slot for owner, or reports which limit is full ("" when it took one).
func (f *inFlight) acquire(owner string, perOwner, total int) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.total >= total:
		return fmt.Sprintf("%d requests are in progress on this server", total)
	case f.byOwner[owner] >= perOwner:
		return fmt.Sprintf("this token has %d requests in progress", perOwner)
	}
	if f.byOwner == nil {
		f.byOwner = map[string]int{}
	}
	f.byOwner[owner]++
	f.total++
	return ""
}

func (f *inFlight) release(owner string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.total--
	if f.byOwner[owner]--; f.byOwner[owner] <= 0 {
		delete(f.byOwner, owner)
	}
}

// InFlight returns how many HTTP requests are in progress (holding a slot under
// Options.MaxInFlight and MaxInFlightTotal), over every token.
func (s *Server) InFlight() int {
	s.inFlight.mu.Lock()
	defer s.inFlight.mu.Unlock()
	return s.inFlight.total
}
