package residual_test

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/residual"
)

// refKey derives a key from docs/design.md's words, independently of key.go: "tf1_" + hex(SHA-256
// of the fields namespace, task, operation, target, each preceded by its big-endian uint64
// byte length).
func refKey(fields ...string) string {
	var buf []byte
	for _, f := range fields {
		buf = binary.BigEndian.AppendUint64(buf, uint64(len(f)))
		buf = append(buf, f...)
	}
	sum := sha256.Sum256(buf)
	return "tf1_" + hex.EncodeToString(sum[:])
}

func TestKeyKnownVectors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ns, task, op, target string
		// want was computed outside Go (Python hashlib + struct.pack('>Q', len)).
		want string
	}{
		{"default", "task-1", "send_email", "email:bob@example.com",
			"tf1_a95da946c621f00fd965998e5a9db25d0f8b6cd907aca961b82efcd4d2fea562"},
		{"", "", "", "",
			"tf1_66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"},
		{"ns", "t", "op", "ünïcødé",
			"tf1_97a26cc1dad93d05d84fdca10e990f982c5671c67c3855b0701aef6cdb83adcf"},
	}
	for _, tt := range tests {
		got := residual.Key(tt.ns, tt.task, tt.op, tt.target)
		require.Equal(t, tt.want, got)
		require.Equal(t, refKey(tt.ns, tt.task, tt.op, tt.target), got)
		require.Len(t, got, residual.KeyLen)
		require.True(t, strings.HasPrefix(got, residual.KeyPrefix))
	}
	require.Equal(t, "tf1_", residual.KeyPrefix)
	require.Equal(t, 4+64, residual.KeyLen)
}

func TestKeyMatchesReferenceDerivation(t *testing.T) {
	t.Parallel()
	inputs := [][4]string{
		{"acme", "run-7", "charge_card", "invoice:INV-42"},
		{"a:b", "c", "d", "e"},
		{"x", "", "y", ""},
		{strings.Repeat("n", 300), "t", "op@v2", "ticket:1"},
		{"\x00", "\x00\x00", "", "\xff"},
	}
	for _, in := range inputs {
		require.Equal(t, refKey(in[:]...), residual.Key(in[0], in[1], in[2], in[3]), "%q", in)
	}
}

// TestKeySeparatorsCannotCollide checks, for every adjacent pair of fields, that moving a
// ':' (or any other byte) across the field boundary changes the key: ("a:b","c") and
// ("a","b:c") are different intents.
func TestKeySeparatorsCannotCollide(t *testing.T) {
	t.Parallel()
	base := [4]string{"ns", "task", "op", "target"}
	for i := 0; i < 3; i++ {
		left, right := base, base
		left[i], left[i+1] = "a:b", "c"
		right[i], right[i+1] = "a", "b:c"
		kl := residual.Key(left[0], left[1], left[2], left[3])
		kr := residual.Key(right[0], right[1], right[2], right[3])
		require.NotEqual(t, kl, kr, "fields %d and %d: %q vs %q", i, i+1, left, right)

		// The naive ':'-join would make these equal; make sure that is the case being tested.
		require.Equal(t, strings.Join(left[:], ":"), strings.Join(right[:], ":"))

		// Without any separator character at all.
		left[i], left[i+1] = "ab", "c"
		right[i], right[i+1] = "a", "bc"
		require.NotEqual(t,
			residual.Key(left[0], left[1], left[2], left[3]),
			residual.Key(right[0], right[1], right[2], right[3]), "fields %d and %d", i, i+1)
	}
	// Non-adjacent positions: the same value in a different field is a different key.
	require.NotEqual(t, residual.Key("x", "", "", ""), residual.Key("", "", "", "x"))
}

func TestKeyEmptyFieldsAllowedAndDistinct(t *testing.T) {
	t.Parallel()
	seen := map[string][4]string{}
	add := func(f [4]string) {
		k := residual.Key(f[0], f[1], f[2], f[3])
		require.NoError(t, residual.ValidKey(k), "%q", f)
		if prev, dup := seen[k]; dup {
			t.Fatalf("Key(%q) == Key(%q) = %s", f, prev, k)
		}
		seen[k] = f
	}
	// "a" in each position alone, the all-empty tuple, and every adjacent ("", "a") / ("a", "").
	add([4]string{})
	for i := 0; i < 4; i++ {
		var f [4]string
		f[i] = "a"
		add(f)
	}
	for i := 0; i < 3; i++ {
		var f [4]string
		f[i], f[i+1] = "a", "a"
		add(f)
	}
	require.NotEqual(t, residual.Key("", "a", "x", "y"), residual.Key("a", "", "x", "y"))
	require.NotEqual(t, residual.Key("ns", "", "a", "y"), residual.Key("ns", "a", "", "y"))
	require.NotEqual(t, residual.Key("ns", "t", "", "a"), residual.Key("ns", "t", "a", ""))
}

func TestKeyDeterministic(t *testing.T) {
	t.Parallel()
	first := residual.Key("ns", "task", "op", "target")
	for i := 0; i < 100; i++ {
		require.Equal(t, first, residual.Key("ns", "task", "op", "target"))
	}
	// Each field matters.
	require.NotEqual(t, first, residual.Key("ns2", "task", "op", "target"))
	require.NotEqual(t, first, residual.Key("ns", "task2", "op", "target"))
	require.NotEqual(t, first, residual.Key("ns", "task", "op2", "target"))
	require.NotEqual(t, first, residual.Key("ns", "task", "op", "target2"))
}

func TestValidKey(t *testing.T) {
	t.Parallel()
	good := residual.Key("ns", "task", "op", "target")
	require.NoError(t, residual.ValidKey(good))
	require.NoError(t, residual.ValidKey(residual.Key("", "", "", "")))

	hexPart := good[len("tf1_"):]
	bad := map[string]string{
		"empty":               "",
		"prefix only":         "tf1_",
		"no prefix":           hexPart,
		"wrong version":       "tf2_" + hexPart,
		"uppercase prefix":    "TF1_" + hexPart,
		"dash not underscore": "tf1-" + hexPart,
		"uppercase hex":       "tf1_" + strings.ToUpper(hexPart),
		"one uppercase digit": "tf1_" + "A" + hexPart[1:],
		"non-hex letter":      "tf1_" + "g" + hexPart[1:],
		"too short":           good[:len(good)-1],
		"too long":            good + "0",
		"double length":       "tf1_" + hexPart + hexPart,
		"space":               "tf1_" + " " + hexPart[1:],
		"trailing newline":    good[:len(good)-1] + "\n",
		"prefix twice":        "tf1_tf1_" + hexPart[8:],
		"non-ascii":           "tf1_" + "é" + hexPart[2:],
	}
	for name, k := range bad {
		err := residual.ValidKey(k)
		require.ErrorIs(t, err, residual.ErrInvalidKey, "%s: %q", name, k)
	}
}
