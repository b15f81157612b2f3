package httpserve

import (
	"fmt"
	"sync"
)

// CheckShape refuses JSON that nests deeper than maxDepth or holds more than maxValues
// objects, arrays and elements (each '{', '[' and ',' outside strings counts one), before
// anything is decoded: decoding materialises every value, at up to ~100 bytes for an
// empty object written in 3. It returns nil when body is within both bounds, else an error
// naming the bound it passed ("nests more than N levels deep" or "holds more than N
// values"). It does not validate the JSON: malformed JSON within the bounds returns nil,
// and the decoder refuses it after. It reads body in one pass and allocates nothing.
func CheckShape(body []byte, maxDepth, maxValues int) error {
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

// InFlight counts the requests in progress, per owner (a token's digest, say) and in all,
// so a server can refuse requests past a cap before it reads their bodies. Its zero value
// is ready to use; it is safe for concurrent use.
type InFlight struct {
	mu      sync.Mutex
	byOwner map[string]int
	total   int
}

// Acquire takes a slot for owner unless total slots are taken over all owners or perOwner
// by owner. It returns "" when it took one (give it back with Release), else, without
// taking any, which limit is full, as a phrase to tell the client ("32 requests are in
// progress on this server", "this token has 16 requests in progress").
func (f *InFlight) Acquire(owner string, perOwner, total int) string {
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

// Release gives back a slot that Acquire took for owner. Call it once per successful
// Acquire, never otherwise.
func (f *InFlight) Release(owner string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.total--
	if f.byOwner[owner]--; f.byOwner[owner] <= 0 {
		delete(f.byOwner, owner)
	}
}

// Total returns how many slots are taken over every owner.
func (f *InFlight) Total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total
}
