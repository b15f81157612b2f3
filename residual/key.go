package residual

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// KeyPrefix starts every key toolfence derives; the digit is the derivation version.
const KeyPrefix = "tf1_"

// KeyLen is the length of a derived key: the prefix and 64 hex digits.
const KeyLen = len(KeyPrefix) + 2*sha256.Size

// Key derives the idempotency key of a call from its intent: "tf1_" followed by the hex
// SHA-256 of namespace, task, operation and target, each preceded by its length as a
// big-endian uint64, so no choice of separators inside fields can make two different
// tuples collide (("a:b","c") and ("a","b:c") give different keys). It never fails.
func Key(namespace, task, operation, target string) string {
	h := sha256.New()
	var n [8]byte
	for _, f := range [...]string{namespace, task, operation, target} {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	var sum [sha256.Size]byte
	return KeyPrefix + hex.EncodeToString(h.Sum(sum[:0]))
}

// ValidKey returns nil if k has the shape of a derived key, or an error wrapping
// ErrInvalidKey that says what is wrong.
func ValidKey(k string) error {
	if len(k) != KeyLen || k[:len(KeyPrefix)] != KeyPrefix {
		return fmt.Errorf("%w: %q: want %q followed by 64 lowercase hex digits", ErrInvalidKey, k, KeyPrefix)
	}
	for i := len(KeyPrefix); i < len(k); i++ {
		c := k[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("%w: %q: byte %d is not lowercase hex", ErrInvalidKey, k, i)
		}
	}
	return nil
}
