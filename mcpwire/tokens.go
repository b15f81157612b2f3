package mcpwire

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"

	"github.com/toolfence/toolfence/interceptor"
)

// MinTokenLen is the shortest bearer token accepted.
const MinTokenLen = 16

// tokensErr is the error of a malformed token file or token: "mcpwire: invalid tokens: "
// and the detail, wrapping interceptor.ErrInvalidOptions.
func tokensErr(format string, args ...any) error {
	return interceptor.InvalidOptions("mcpwire: invalid tokens", format, args...)
}

// Tokens maps bearer tokens to namespaces, and says which tokens are also granted the raw
// ledger protocol (ledger/remote at /ledger/v1/). Tokens are kept as SHA-256 digests, so a
// lookup does not compare secrets byte by byte. The zero value holds no tokens.
type Tokens struct {
	byHash map[[sha256.Size]byte]string
	// ledger holds the digests of the tokens granted the ledger protocol.
	ledger map[[sha256.Size]byte]bool
}

// Add maps token to namespace. It returns an error wrapping interceptor.ErrInvalidOptions for a token
// shorter than MinTokenLen or containing whitespace, an empty namespace, or a token that
// is already mapped to another namespace.
func (t *Tokens) Add(token, namespace string) error {
	switch {
	case len(token) < MinTokenLen:
		return tokensErr("a token is %d bytes long, want at least %d", len(token), MinTokenLen)
	case strings.ContainsFunc(token, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return tokensErr("a token contains whitespace or control characters")
	case namespace == "":
		return tokensErr("a token maps to an empty namespace")
	}
	if t.byHash == nil {
		t.byHash = map[[sha256.Size]byte]string{}
	}
	h := sha256.Sum256([]byte(token))
	if prev, ok := t.byHash[h]; ok && prev != namespace {
		return tokensErr("one token maps to namespaces %q and %q", prev, namespace)
	}
	t.byHash[h] = namespace
	return nil
}

// GrantLedger maps token to namespace as Add does, and also grants it the raw ledger
// protocol of that namespace (`toolfence serve --http` serves it at /ledger/v1/ to such
// tokens only). It returns Add's errors.
func (t *Tokens) GrantLedger(token, namespace string) error {
	if err := t.Add(token, namespace); err != nil {
		return err
	}
	if t.ledger == nil {
		t.ledger = map[[sha256.Size]byte]bool{}
	}
	t.ledger[sha256.Sum256([]byte(token))] = true
	return nil
}

// Ledger returns the namespace of token, whether the token is known, and whether it is
// granted the raw ledger protocol (GrantLedger).
func (t Tokens) Ledger(token string) (namespace string, known, granted bool) {
	ns, ok := t.Namespace(token)
	return ns, ok, ok && t.ledger[sha256.Sum256([]byte(token))]
}

// Len returns how many tokens are configured.
func (t Tokens) Len() int { return len(t.byHash) }

// Namespace returns the namespace of token and whether the token is known.
func (t Tokens) Namespace(token string) (string, bool) {
	if token == "" || len(t.byHash) == 0 {
		return "", false
	}
	ns, ok := t.byHash[sha256.Sum256([]byte(token))]
	return ns, ok
}

// ParseTokens reads a token file. Two formats are accepted:
//
//   - JSON: an object {"TOKEN": "NAMESPACE", ...} or an array
//     [{"token": "TOKEN", "namespace": "NAMESPACE", "ledger": true}, ...];
//   - lines: "TOKEN NAMESPACE", "TOKEN NAMESPACE ledger" or just "TOKEN" (which maps to
//     defaultNamespace); blank lines and lines starting with '#' are skipped.
//
// A token serves MCP; "ledger" (a third word, or "ledger": true) also grants it the raw
// ledger protocol of its namespace (GrantLedger): give it only to toolfence processes that
// use the store with --store http://…, never to an MCP agent.
//
// It returns an error wrapping interceptor.ErrInvalidOptions naming the bad line or entry, for a token
// given more than once (in either format), or for a file without any token.
func ParseTokens(data []byte, defaultNamespace string) (Tokens, error) {
	var t Tokens
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && (trimmed[0] == '{' || trimmed[0] == '[') {
		if err := t.parseJSON(trimmed); err != nil {
			return Tokens{}, err
		}
	} else {
		sc := bufio.NewScanner(bytes.NewReader(data))
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			f := strings.Fields(line)
			ns, add := defaultNamespace, t.Add
			switch {
			case len(f) == 1:
			case len(f) == 2:
				ns = f[1]
			case len(f) == 3 && f[2] == "ledger":
				ns, add = f[1], t.GrantLedger
			case len(f) == 3:
				return Tokens{}, tokensErr("line %d: the third word is %q: the only grant is \"ledger\" (TOKEN NAMESPACE ledger)", n, f[2])
			default:
				return Tokens{}, tokensErr("line %d: want \"TOKEN\", \"TOKEN NAMESPACE\" or \"TOKEN NAMESPACE ledger\", got %d fields", n, len(f))
			}
			if _, dup := t.Namespace(f[0]); dup {
				return Tokens{}, fmt.Errorf("line %d: %w", n, tokensErr("a token appears more than once"))
			}
			if err := add(f[0], ns); err != nil {
				return Tokens{}, fmt.Errorf("line %d: %w", n, err)
			}
		}
		if err := sc.Err(); err != nil {
			return Tokens{}, tokensErr("%w", err)
		}
	}
	if t.Len() == 0 {
		return Tokens{}, tokensErr("no token found")
	}
	return t, nil
}

func (t *Tokens) parseJSON(data []byte) error {
	if data[0] == '{' {
		var m map[string]string
		if err := json.Unmarshal(data, &m); err != nil {
			return tokensErr("want {\"TOKEN\": \"NAMESPACE\"}: %w", err)
		}
		// Unmarshal keeps the last of duplicated names: count them instead.
		if n, err := objectNames(data); err != nil || n != len(m) {
			return tokensErr("a token appears more than once")
		}
		for tok, ns := range m {
			if err := t.Add(tok, ns); err != nil {
				return err
			}
		}
		return nil
	}
	var list []struct {
		Token     string `json:"token"`
		Namespace string `json:"namespace"`
		Ledger    bool   `json:"ledger"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&list); err != nil {
		return tokensErr("want [{\"token\": ..., \"namespace\": ..., \"ledger\": false}]: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return tokensErr("more than one JSON value in the token file")
	}
	for i, e := range list {
		if _, dup := t.Namespace(e.Token); dup {
			return fmt.Errorf("entry %d: %w", i, tokensErr("a token appears more than once"))
		}
		add := t.Add
		if e.Ledger {
			add = t.GrantLedger
		}
		if err := add(e.Token, e.Namespace); err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
	}
	return nil
}

// objectNames counts the names of the top-level JSON object data (valid JSON).
func objectNames(data []byte) (int, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil { // {
		return 0, err
	}
	n := 0
	for dec.More() {
		if _, err := dec.Token(); err != nil { // the name
			return 0, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return 0, err
		}
		n++
	}
	return n, nil
}

// LoadTokens reads the token file at path (see ParseTokens). It refuses a file that other
// users may read or write, since it holds secrets.
func LoadTokens(path, defaultNamespace string) (Tokens, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Tokens{}, fmt.Errorf("mcpwire: token file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return Tokens{}, tokensErr("token file %s has mode %v: other users may read it; chmod 600 it", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Tokens{}, fmt.Errorf("mcpwire: token file: %w", err)
	}
	t, err := ParseTokens(data, defaultNamespace)
	if err != nil {
		return Tokens{}, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// ErrUnsafeBind is returned when HTTP would be served on a non-loopback address without
// any bearer token.
var ErrUnsafeBind = errors.New("mcpwire: refusing to serve HTTP on a non-loopback address without a bearer token (use --token-file or TOOLFENCE_TOKEN)")

// CheckBind returns nil when addr (host:port) may be served with the given number of
// tokens: any address with tokens, only a loopback address (127.0.0.0/8, ::1, localhost)
// without. Otherwise it returns an error wrapping ErrUnsafeBind; an empty or unspecified
// host (":7777", "0.0.0.0") is not loopback.
func CheckBind(addr string, tokens int) error {
	if tokens > 0 {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("mcpwire: address %q: %w", addr, err)
	}
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%w: %q", ErrUnsafeBind, addr)
}

// bearer returns the token of an "Authorization: Bearer TOKEN" header, or "".
// Authenticate returns the namespace of r's bearer token and an owner id for it (a digest
// of the token, never the token), or writes 401 with a WWW-Authenticate challenge (the
// token is missing, or not one of t) and returns ok false. who names the server in the
// message ("toolfence", "toolfence proxy"); tokens come from its --token-file.
func (t Tokens) Authenticate(w http.ResponseWriter, r *http.Request, who string) (ns, owner string, ok bool) {
	tok := bearer(r)
	ns, ok = t.Namespace(tok)
	if !ok {
		challenge, msg := `Bearer realm="toolfence"`, who+": missing bearer token: send Authorization: Bearer TOKEN with a token of the --token-file"
		if tok != "" {
			challenge += `, error="invalid_token"`
			msg = who + ": invalid bearer token: it is not in the --token-file"
		}
		w.Header().Set("WWW-Authenticate", challenge)
		http.Error(w, msg, http.StatusUnauthorized)
		return "", "", false
	}
	sum := sha256.Sum256([]byte(tok))
	return ns, hex.EncodeToString(sum[:8]), true
}

func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return ""
	}
	return strings.TrimSpace(h[len(prefix):])
}
