package mcpserver

import (
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// checkText refuses tool arguments that a JSON decoder would silently repair: bytes that
// are not UTF-8, and \u escapes of lone UTF-16 surrogates. Both decode to U+FFFD, so
// different task, operation or target strings would otherwise derive one key and replay
// each other's results.
func checkText(raw []byte) error {
	if !utf8.Valid(raw) {
		return errors.New("arguments are not valid UTF-8 (invalid bytes would be replaced and could collide with other keys)")
	}
	inString, pendingHigh := false, false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if !inString {
			inString = c == '"'
			continue
		}
		switch c {
		case '"':
			if pendingHigh {
				return errors.New(`arguments hold a lone UTF-16 surrogate escape (\uD800-\uDBFF without its low half)`)
			}
			inString = false
		case '\\':
			if i+1 >= len(raw) {
				return nil // the decoder reports the syntax error
			}
			if raw[i+1] != 'u' || i+5 >= len(raw) {
				if pendingHigh {
					return errors.New(`arguments hold a lone UTF-16 surrogate escape (\uD800-\uDBFF without its low half)`)
				}
				i++
				continue
			}
			v, err := strconv.ParseUint(string(raw[i+2:i+6]), 16, 16)
			if err != nil {
				return nil // the decoder reports the syntax error
			}
			r := rune(v)
			switch {
			case pendingHigh && r >= 0xDC00 && r <= 0xDFFF:
				pendingHigh = false
			case pendingHigh || r >= 0xDC00 && r <= 0xDFFF:
				return errors.New(`arguments hold a lone UTF-16 surrogate escape (\uD800-\uDFFF not in a pair)`)
			case utf16.IsSurrogate(r):
				pendingHigh = true
			}
			i += 5
		default:
			if pendingHigh {
				return errors.New(`arguments hold a lone UTF-16 surrogate escape (\uD800-\uDBFF without its low half)`)
			}
		}
	}
	return nil
}
