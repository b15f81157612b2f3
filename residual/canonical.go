package residual

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
)

// ErrInvalidJSON is wrapped by every error Canonical (and Digest) returns
// for bad input, so callers can test for it with errors.Is. The wrapping
// error's message names the problem and, where possible, the byte offset
// in the input, e.g. `residual: invalid JSON: duplicate key "a" at offset 12`.
var ErrInvalidJSON = errors.New("residual: invalid JSON")

// maxDepth is the deepest nesting of arrays and objects Canonical accepts.
const maxDepth = 1000

// plainZeroLimit is the most zero digits, beyond the significant digits,
// that a number may need in plain decimal notation; see Canonical.
const plainZeroLimit = 21

// maxExpDigits is the most significant digits an exponent literal may have
// (so that exponent arithmetic fits comfortably in an int64).
const maxExpDigits = 18

// Canonical returns the canonical JSON encoding of a JSON document (RFC 8785
// style), so that two documents that denote the same JSON value have
// byte-identical canonical forms. doc must contain exactly one JSON value
// (RFC 8259 grammar), optionally surrounded by whitespace.
//
// The canonical form has no insignificant whitespace and:
//
//   - object members are sorted by key, comparing keys as sequences of
//     UTF-16 code units (RFC 8785 §3.2.3);
//   - strings have their escapes decoded and are re-encoded minimally: only
//     '"', '\' and control characters below U+0020 are escaped (as \b, \t,
//     \n, \f, \r where such a short form exists, otherwise as \u00xx with
//     lowercase hex); every other character is written as literal UTF-8;
//   - numbers are normalised exactly, without any float64 rounding: leading
//     zeros of the mantissa and trailing zeros are removed, any zero
//     (including -0, 0.0 and 0e10) becomes 0, and the result is written in
//     plain decimal notation when that needs at most 21 zero digits beyond
//     the significant digits (counting the "0" before the point of a number
//     below 1), otherwise in scientific notation d.ddde+N / d.ddde-N with
//     lowercase e and an explicit exponent sign. So 1.0 → 1, 1e2 → 100,
//     0.10 → 0.1, 1e21 → 1000000000000000000000, 1e22 → 1e+22,
//     1.5e300 → 1.5e+300, 1e-300 → 1e-300, and big integers keep all their
//     digits;
//   - true, false and null are written as is.
//
// On failure Canonical returns a nil slice and an error wrapping
// ErrInvalidJSON. Inputs that fail are: empty or whitespace-only input,
// anything that is not valid RFC 8259 JSON, data after the top-level value,
// duplicate keys within one object (compared after decoding escapes),
// invalid UTF-8 in strings, \u escapes that are lone surrogates, nesting of
// arrays and objects deeper than 1000 levels, and non-zero numbers whose
// exponent literal has more than 18 significant digits.
//
// Canonical is idempotent: Canonical(Canonical(doc)) equals Canonical(doc).
// It is safe for concurrent use and does not retain doc.
func Canonical(doc []byte) ([]byte, error) {
	p := parserPool.Get().(*parser)
	p.in = doc
	p.pos = 0
	p.depth = 0
	p.out = make([]byte, 0, len(doc)+16)
	out, err := p.document()
	p.release()
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Digest returns the lowercase hexadecimal SHA-256 of Canonical(doc), a
// 64-character string that is equal for any two documents denoting the same
// JSON value. On failure it returns "" and Canonical's error (which wraps
// ErrInvalidJSON).
func Digest(doc []byte) (string, error) {
	c, err := Canonical(doc)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:]), nil
}

// member records one object member while its object is being parsed.
type member struct {
	keyStart, keyEnd int // decoded key in parser.keys
	segStart, segEnd int // canonical `"key":value` in parser.out
	off              int // input offset of the key's opening quote
}

// parser is a recursive-descent JSON scanner that writes the canonical form
// to out as it goes. keys and members are stacks shared by all open
// objects; scratch and str are reusable buffers.
type parser struct {
	in    []byte
	pos   int
	depth int
	out   []byte

	keys    []byte
	members []member
	scratch []byte
	str     []byte
	num     []byte
}

var parserPool = sync.Pool{New: func() any { return new(parser) }}

// release drops references to caller memory and returns p to the pool,
// unless its buffers have grown too large to be worth keeping.
func (p *parser) release() {
	p.in, p.out = nil, nil
	const keep = 64 << 10
	if cap(p.keys) > keep || cap(p.scratch) > keep || cap(p.str) > keep ||
		cap(p.num) > keep || cap(p.members) > keep/8 {
		return
	}
	p.keys = p.keys[:0]
	p.members = p.members[:0]
	parserPool.Put(p)
}

func errAt(off int, msg string) error {
	return fmt.Errorf("%w: %s at offset %d", ErrInvalidJSON, msg, off)
}

func (p *parser) document() ([]byte, error) {
	p.skipWS()
	if p.pos == len(p.in) {
		return nil, errAt(p.pos, "empty input")
	}
	if err := p.value(); err != nil {
		return nil, err
	}
	p.skipWS()
	if p.pos != len(p.in) {
		return nil, errAt(p.pos, "unexpected data after top-level value")
	}
	return p.out, nil
}

func (p *parser) skipWS() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// value parses one JSON value at p.pos (after optional whitespace).
func (p *parser) value() error {
	p.skipWS()
	if p.pos >= len(p.in) {
		return errAt(p.pos, "unexpected end of input, expected a value")
	}
	switch c := p.in[p.pos]; c {
	case '{':
		return p.object()
	case '[':
		return p.array()
	case '"':
		start := p.pos
		s, escaped, err := p.scanString()
		if err != nil {
			return err
		}
		if escaped {
			p.out = appendQuoted(p.out, s)
		} else {
			p.out = append(p.out, p.in[start:p.pos]...)
		}
		return nil
	case 't':
		return p.literal("true")
	case 'f':
		return p.literal("false")
	case 'n':
		return p.literal("null")
	default:
		if c == '-' || isDigit(c) {
			return p.number()
		}
		return errAt(p.pos, fmt.Sprintf("unexpected character %q, expected a value", c))
	}
}

func (p *parser) literal(lit string) error {
	if !bytes.HasPrefix(p.in[p.pos:], []byte(lit)) {
		return errAt(p.pos, "invalid literal, expected "+lit)
	}
	p.pos += len(lit)
	p.out = append(p.out, lit...)
	return nil
}

func (p *parser) enter() error {
	p.depth++
	if p.depth > maxDepth {
		return errAt(p.pos, "nesting deeper than "+strconv.Itoa(maxDepth)+" levels")
	}
	return nil
}

func (p *parser) array() error {
	if err := p.enter(); err != nil {
		return err
	}
	p.pos++ // '['
	p.out = append(p.out, '[')
	p.skipWS()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		p.out = append(p.out, ']')
		p.depth--
		return nil
	}
	for {
		if err := p.value(); err != nil {
			return err
		}
		p.skipWS()
		if p.pos >= len(p.in) {
			return errAt(p.pos, "unexpected end of input in array")
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
			p.out = append(p.out, ',')
		case ']':
			p.pos++
			p.out = append(p.out, ']')
			p.depth--
			return nil
		default:
			return errAt(p.pos, fmt.Sprintf("unexpected character %q, expected ',' or ']' in array", p.in[p.pos]))
		}
	}
}

func (p *parser) object() error {
	if err := p.enter(); err != nil {
		return err
	}
	p.pos++ // '{'
	p.out = append(p.out, '{')
	contentStart := len(p.out)
	mbase, kbase := len(p.members), len(p.keys)
	p.skipWS()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		p.out = append(p.out, '}')
		p.depth--
		return nil
	}
	for {
		p.skipWS()
		if p.pos >= len(p.in) {
			return errAt(p.pos, "unexpected end of input, expected object key")
		}
		if p.in[p.pos] != '"' {
			return errAt(p.pos, fmt.Sprintf("unexpected character %q, expected string object key", p.in[p.pos]))
		}
		if len(p.members) > mbase {
			p.out = append(p.out, ',')
		}
		m := member{off: p.pos, segStart: len(p.out)}
		s, escaped, err := p.scanString()
		if err != nil {
			return err
		}
		m.keyStart = len(p.keys)
		p.keys = append(p.keys, s...)
		m.keyEnd = len(p.keys)
		if escaped {
			p.out = appendQuoted(p.out, s)
		} else {
			p.out = append(p.out, p.in[m.off:p.pos]...)
		}
		p.skipWS()
		if p.pos >= len(p.in) {
			return errAt(p.pos, "unexpected end of input, expected ':'")
		}
		if p.in[p.pos] != ':' {
			return errAt(p.pos, fmt.Sprintf("unexpected character %q, expected ':' after object key", p.in[p.pos]))
		}
		p.pos++
		p.out = append(p.out, ':')
		if err := p.value(); err != nil {
			return err
		}
		m.segEnd = len(p.out)
		p.members = append(p.members, m)
		p.skipWS()
		if p.pos >= len(p.in) {
			return errAt(p.pos, "unexpected end of input in object")
		}
		if c := p.in[p.pos]; c == ',' {
			p.pos++
			continue
		} else if c != '}' {
			return errAt(p.pos, fmt.Sprintf("unexpected character %q, expected ',' or '}' in object", c))
		}
		p.pos++
		break
	}
	if err := p.sortMembers(contentStart, p.members[mbase:]); err != nil {
		return err
	}
	p.members = p.members[:mbase]
	p.keys = p.keys[:kbase]
	p.out = append(p.out, '}')
	p.depth--
	return nil
}

// sortMembers reorders the member segments written to p.out since
// contentStart into UTF-16 key order, and rejects duplicate keys.
func (p *parser) sortMembers(contentStart int, ms []member) error {
	key := func(m member) []byte { return p.keys[m.keyStart:m.keyEnd] }
	sorted := true
	for i := 1; i < len(ms); i++ {
		if compareUTF16(key(ms[i-1]), key(ms[i])) >= 0 {
			sorted = false
			break
		}
	}
	if sorted {
		return nil // common case: already canonical order, no duplicates
	}
	slices.SortFunc(ms, func(a, b member) int {
		if c := compareUTF16(key(a), key(b)); c != 0 {
			return c
		}
		return cmp.Compare(a.off, b.off)
	})
	// Report the first key (in input order) that repeats an earlier one.
	dup := -1
	for i := 1; i < len(ms); i++ {
		if bytes.Equal(key(ms[i-1]), key(ms[i])) && (dup < 0 || ms[i].off < ms[dup].off) {
			dup = i
		}
	}
	if dup >= 0 {
		return errAt(ms[dup].off, "duplicate key "+quoteForError(key(ms[dup])))
	}
	p.scratch = append(p.scratch[:0], p.out[contentStart:]...)
	p.out = p.out[:contentStart]
	for i, m := range ms {
		if i > 0 {
			p.out = append(p.out, ',')
		}
		p.out = append(p.out, p.scratch[m.segStart-contentStart:m.segEnd-contentStart]...)
	}
	return nil
}

func quoteForError(k []byte) string {
	const max = 64
	if len(k) > max {
		return strconv.Quote(string(k[:max])) + "..."
	}
	return strconv.Quote(string(k))
}

// compareUTF16 compares two valid UTF-8 strings as sequences of UTF-16 code
// units, returning -1, 0 or +1.
func compareUTF16(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return cmp.Compare(len(a), len(b))
	}
	if a[i] < utf8.RuneSelf && b[i] < utf8.RuneSelf {
		return cmp.Compare(a[i], b[i])
	}
	// a[:i] == b[:i], so the runes containing byte i start at the same
	// offset in both strings.
	for i > 0 && a[i]&0xC0 == 0x80 {
		i--
	}
	ra, _ := utf8.DecodeRune(a[i:])
	rb, _ := utf8.DecodeRune(b[i:])
	return cmp.Compare(utf16Weight(ra), utf16Weight(rb))
}

// utf16Weight maps a rune to a value whose order equals the UTF-16 code unit
// order of the rune's encoding: BMP characters below the surrogate range sort
// first, then supplementary characters (encoded with surrogates 0xD800-0xDFFF),
// then BMP characters U+E000..U+FFFF.
func utf16Weight(r rune) rune {
	if r >= 0xE000 && r <= 0xFFFF {
		return r + 0x200000
	}
	return r
}

// scanString parses the string literal at p.pos (which holds '"'), leaving
// p.pos after the closing quote. It returns the decoded content and whether
// the literal had escapes. Without escapes the content aliases the input and
// the literal is already in canonical form; with escapes the content lives
// in p.str and is valid until the next call.
func (p *parser) scanString() ([]byte, bool, error) {
	in := p.in
	start := p.pos + 1
	i := start
	for i < len(in) {
		c := in[i]
		switch {
		case c == '"':
			p.pos = i + 1
			return in[start:i], false, nil
		case c == '\\':
			return p.scanEscapedString(start, i)
		case c < 0x20:
			return nil, false, errAt(i, "control character in string")
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError && size == 1 {
				return nil, false, errAt(i, "invalid UTF-8 in string")
			}
			i += size
		}
	}
	return nil, false, errAt(p.pos, "unterminated string")
}

// scanEscapedString continues scanString from the first backslash at i.
func (p *parser) scanEscapedString(start, i int) ([]byte, bool, error) {
	in := p.in
	dst := append(p.str[:0], in[start:i]...)
	for i < len(in) {
		c := in[i]
		switch {
		case c == '"':
			p.pos = i + 1
			p.str = dst
			return dst, true, nil
		case c == '\\':
			if i+1 >= len(in) {
				return nil, false, errAt(p.pos, "unterminated string")
			}
			switch e := in[i+1]; e {
			case '"', '\\', '/':
				dst = append(dst, e)
				i += 2
			case 'b':
				dst = append(dst, '\b')
				i += 2
			case 'f':
				dst = append(dst, '\f')
				i += 2
			case 'n':
				dst = append(dst, '\n')
				i += 2
			case 'r':
				dst = append(dst, '\r')
				i += 2
			case 't':
				dst = append(dst, '\t')
				i += 2
			case 'u':
				r, ok := hex4(in[i+2:])
				if !ok {
					return nil, false, errAt(i, `invalid \u escape in string`)
				}
				switch {
				case r >= 0xDC00 && r <= 0xDFFF:
					return nil, false, errAt(i, `lone low surrogate \u escape in string`)
				case r >= 0xD800 && r <= 0xDBFF:
					var lo rune
					ok = i+7 < len(in) && in[i+6] == '\\' && in[i+7] == 'u'
					if ok {
						lo, ok = hex4(in[i+8:])
					}
					if !ok || lo < 0xDC00 || lo > 0xDFFF {
						return nil, false, errAt(i, `lone high surrogate \u escape in string`)
					}
					r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
					i += 12
				default:
					i += 6
				}
				dst = utf8.AppendRune(dst, r)
			default:
				return nil, false, errAt(i, fmt.Sprintf("invalid escape %q in string", in[i:i+2]))
			}
		case c < 0x20:
			return nil, false, errAt(i, "control character in string")
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			r, size := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError && size == 1 {
				return nil, false, errAt(i, "invalid UTF-8 in string")
			}
			dst = append(dst, in[i:i+size]...)
			i += size
		}
	}
	p.str = dst
	return nil, false, errAt(p.pos, "unterminated string")
}

// hex4 decodes four hex digits at the start of b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

const hexDigits = "0123456789abcdef"

// appendQuoted appends s (valid UTF-8) as a minimally escaped JSON string.
func appendQuoted(out, s []byte) []byte {
	out = append(out, '"')
	start := 0
	for i, c := range s {
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		out = append(out, s[start:i]...)
		switch c {
		case '"', '\\':
			out = append(out, '\\', c)
		case '\b':
			out = append(out, '\\', 'b')
		case '\f':
			out = append(out, '\\', 'f')
		case '\n':
			out = append(out, '\\', 'n')
		case '\r':
			out = append(out, '\\', 'r')
		case '\t':
			out = append(out, '\\', 't')
		default:
			out = append(out, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
		}
		start = i + 1
	}
	out = append(out, s[start:]...)
	return append(out, '"')
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number parses the number at p.pos and writes its exact canonical form.
func (p *parser) number() error {
	in := p.in
	start := p.pos
	i := start
	neg := false
	if in[i] == '-' {
		neg = true
		i++
	}
	intStart := i
	switch {
	case i >= len(in) || !isDigit(in[i]):
		return errAt(start, "invalid number: missing digits")
	case in[i] == '0':
		i++
		if i < len(in) && isDigit(in[i]) {
			return errAt(start, "invalid number: leading zero")
		}
	default:
		for i < len(in) && isDigit(in[i]) {
			i++
		}
	}
	intEnd := i
	fracStart, fracEnd := i, i
	if i < len(in) && in[i] == '.' {
		i++
		fracStart = i
		for i < len(in) && isDigit(in[i]) {
			i++
		}
		if i == fracStart {
			return errAt(start, "invalid number: missing digits after decimal point")
		}
		fracEnd = i
	}
	var exp int64
	expTooBig := false
	hasExp := false
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		hasExp = true
		i++
		expNeg := false
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			expNeg = in[i] == '-'
			i++
		}
		ds := i
		sig := 0
		for i < len(in) && isDigit(in[i]) {
			if sig > 0 || in[i] != '0' {
				sig++
				if sig <= maxExpDigits {
					exp = exp*10 + int64(in[i]-'0')
				}
			}
			i++
		}
		if i == ds {
			return errAt(start, "invalid number: missing exponent digits")
		}
		expTooBig = sig > maxExpDigits
		if expNeg {
			exp = -exp
		}
	}
	p.pos = i

	intPart := in[intStart:intEnd]
	if !hasExp && fracEnd == fracStart {
		// Fast path: plain integer literal.
		if len(intPart) == 1 && intPart[0] == '0' {
			p.out = append(p.out, '0')
			return nil
		}
		tz := 0
		for tz < len(intPart) && intPart[len(intPart)-1-tz] == '0' {
			tz++
		}
		if tz <= plainZeroLimit {
			p.out = append(p.out, in[start:i]...)
			return nil
		}
	}

	// General path: value = digits × 10^e, digits without leading or
	// trailing zeros.
	digits := append(p.num[:0], intPart...)
	digits = append(digits, in[fracStart:fracEnd]...)
	p.num = digits
	e := exp - int64(fracEnd-fracStart)
	lead := 0
	for lead < len(digits) && digits[lead] == '0' {
		lead++
	}
	digits = digits[lead:]
	for len(digits) > 0 && digits[len(digits)-1] == '0' {
		digits = digits[:len(digits)-1]
		e++
	}
	if len(digits) == 0 {
		p.out = append(p.out, '0')
		return nil
	}
	if expTooBig {
		return errAt(start, "number exponent too large (more than "+strconv.Itoa(maxExpDigits)+" digits)")
	}
	if neg {
		p.out = append(p.out, '-')
	}
	p.out = appendDecimal(p.out, digits, e)
	return nil
}

// appendDecimal writes digits × 10^e, where digits is non-empty with no
// leading or trailing zeros, in plain notation when that needs at most
// plainZeroLimit padding zeros and in scientific notation otherwise.
func appendDecimal(out, digits []byte, e int64) []byte {
	n := int64(len(digits))
	switch {
	case e >= 0 && e <= plainZeroLimit: // ddd000
		out = append(out, digits...)
		for range e {
			out = append(out, '0')
		}
		return out
	case e < 0 && n+e > 0: // dd.ddd
		out = append(out, digits[:n+e]...)
		out = append(out, '.')
		return append(out, digits[n+e:]...)
	case e < 0 && 1-(n+e) <= plainZeroLimit: // 0.000ddd
		out = append(out, '0', '.')
		for range -(n + e) {
			out = append(out, '0')
		}
		return append(out, digits...)
	}
	x := e + n - 1
	out = append(out, digits[0])
	if n > 1 {
		out = append(out, '.')
		out = append(out, digits[1:]...)
	}
	out = append(out, 'e')
	if x < 0 {
		out = append(out, '-')
		x = -x
	} else {
		out = append(out, '+')
	}
	return strconv.AppendInt(out, x, 10)
}
