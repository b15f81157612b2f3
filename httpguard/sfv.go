package httpguard

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// MaxKeyLength is the longest Idempotency-Key value (after unquoting) the guard accepts.
const MaxKeyLength = 255

// ErrInvalidKey is wrapped by every key parsing error (RequestKey's, and the detail of a
// Guard's 400 problem): the header is missing, repeated, empty, too long or malformed.
var ErrInvalidKey = errors.New("httpguard: invalid Idempotency-Key")

// RequestKey returns the Idempotency-Key of r as a Guard with default options reads it: an
// RFC 8941 structured-field string (`"tf1_…"`, as tools.Transport sends it) unquoted, or a
// bare key (`tf1_…`) as is, so both forms give the same key. Servers that store keys without
// the guard (and fake upstreams in tests) use it to compare keys with the ones toolfence
// records. It returns an error wrapping ErrInvalidKey that says what is wrong when the header
// is missing, sent more than once, empty, longer than MaxKeyLength or malformed.
func RequestKey(r *http.Request) (string, error) {
	lines := r.Header.Values(KeyHeader)
	if len(lines) == 0 {
		return "", fmt.Errorf("%w: the header is missing", ErrInvalidKey)
	}
	return parseKey(lines, true)
}

// parseKey parses the Idempotency-Key field lines of a request as an RFC 8941 Item whose
// bare item is a String (the draft's definition): `"8e03978e-40d5-43e8-bc93-6894a57f9324"`.
// Parameters after the string are parsed and ignored, as RFC 8941 asks. With allowRaw, an
// unquoted value of visible ASCII without DQUOTE, backslash, comma or semicolon is also
// accepted (the form most APIs and their clients use). It returns the unquoted key, or an
// error wrapping ErrInvalidKey that says what is wrong.
func parseKey(lines []string, allowRaw bool) (string, error) {
	if len(lines) > 1 {
		return "", fmt.Errorf("%w: the header appears %d times; send it once", ErrInvalidKey, len(lines))
	}
	in := strings.Trim(lines[0], " \t")
	if in == "" {
		return "", fmt.Errorf("%w: the header is empty", ErrInvalidKey)
	}
	if in[0] != '"' {
		if allowRaw && rawKey(in) {
			return checkLen(in)
		}
		if allowRaw {
			return "", fmt.Errorf(`%w: %q is neither a structured-field string nor a bare key (visible ASCII without '"', '\\', ',' or ';'); send it quoted, e.g. Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`, ErrInvalidKey, clip(in))
		}
		return "", fmt.Errorf(`%w: %q is not a structured-field string; quote it, e.g. Idempotency-Key: "%s"`, ErrInvalidKey, clip(in), clip(in))
	}
	p := &sfParser{in: in}
	key, err := p.str()
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	if err := p.params(); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	if p.pos != len(p.in) {
		return "", fmt.Errorf("%w: unexpected %q after the string (one key per request)", ErrInvalidKey, clip(p.in[p.pos:]))
	}
	return checkLen(key)
}

func checkLen(key string) (string, error) {
	switch {
	case key == "":
		return "", fmt.Errorf("%w: the key is the empty string", ErrInvalidKey)
	case len(key) > MaxKeyLength:
		return "", fmt.Errorf("%w: the key is %d characters long, the limit is %d", ErrInvalidKey, len(key), MaxKeyLength)
	}
	return key, nil
}

// rawKey reports whether s is a usable unquoted key.
func rawKey(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == ',' || c == ';' {
			return false
		}
	}
	return true
}

// clip shortens s for error messages.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// sfParser is the subset of the RFC 8941 parsing algorithms an Item needs.
type sfParser struct {
	in  string
	pos int
}

func (p *sfParser) peek() byte {
	if p.pos < len(p.in) {
		return p.in[p.pos]
	}
	return 0
}

// str parses sf-string (RFC 8941 section 4.2.5).
func (p *sfParser) str() (string, error) {
	if p.peek() != '"' {
		return "", fmt.Errorf("expected a string at offset %d", p.pos)
	}
	p.pos++
	var b strings.Builder
	for p.pos < len(p.in) {
		c := p.in[p.pos]
		p.pos++
		switch {
		case c == '\\':
			if p.pos >= len(p.in) {
				return "", errors.New("the string ends in a backslash")
			}
			n := p.in[p.pos]
			p.pos++
			if n != '"' && n != '\\' {
				return "", fmt.Errorf(`only \" and \\ may be escaped in a structured-field string, not \%c`, n)
			}
			b.WriteByte(n)
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("byte 0x%02x at offset %d is not printable ASCII", c, p.pos-1)
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("the string has no closing quote")
}

// params parses and discards parameters (RFC 8941 section 4.2.3.2).
func (p *sfParser) params() error {
	for p.peek() == ';' {
		p.pos++
		for p.peek() == ' ' {
			p.pos++
		}
		if err := p.key(); err != nil {
			return err
		}
		if p.peek() == '=' {
			p.pos++
			if err := p.bareItem(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *sfParser) key() error {
	c := p.peek()
	if !(c >= 'a' && c <= 'z' || c == '*') {
		return fmt.Errorf("a parameter key must start with a lowercase letter or '*' (offset %d)", p.pos)
	}
	for p.pos < len(p.in) {
		c := p.in[p.pos]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.pos++
	}
	return nil
}

func (p *sfParser) bareItem() error {
	switch c := p.peek(); {
	case c == '"':
		_, err := p.str()
		return err
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == '@':
		p.pos++
		return p.number()
	case c == '?':
		if p.pos+1 < len(p.in) && (p.in[p.pos+1] == '0' || p.in[p.pos+1] == '1') {
			p.pos += 2
			return nil
		}
		return fmt.Errorf("bad boolean at offset %d", p.pos)
	case c == ':':
		end := strings.IndexByte(p.in[p.pos+1:], ':')
		if end < 0 {
			return errors.New("a byte sequence has no closing ':'")
		}
		for _, b := range []byte(p.in[p.pos+1 : p.pos+1+end]) {
			if !(b >= 'A' && b <= 'Z' || b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '+' || b == '/' || b == '=') {
				return fmt.Errorf("byte 0x%02x is not base64 in a byte sequence", b)
			}
		}
		p.pos += end + 2
		return nil
	case c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '*':
		for p.pos < len(p.in) && tokenChar(p.in[p.pos]) {
			p.pos++
		}
		return nil
	default:
		return fmt.Errorf("unexpected %q in a parameter value", c)
	}
}

func (p *sfParser) number() error {
	start := p.pos
	if p.peek() == '-' {
		p.pos++
	}
	digits, frac, dot := 0, 0, false
	for p.pos < len(p.in) {
		c := p.in[p.pos]
		switch {
		case c >= '0' && c <= '9':
			if dot {
				frac++
			} else {
				digits++
			}
		case c == '.' && !dot:
			dot = true
		default:
			goto done
		}
		p.pos++
	}
done:
	switch {
	case digits == 0:
		return fmt.Errorf("bad number at offset %d", start)
	case !dot && digits > 15, dot && (digits > 12 || frac == 0 || frac > 3):
		return fmt.Errorf("number out of range at offset %d", start)
	}
	return nil
}

// tokenChar reports whether c may continue an sf-token: tchar, ':' or '/'.
func tokenChar(c byte) bool {
	if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}
