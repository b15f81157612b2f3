package httpguard

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in       []string
		allowRaw bool
		want     string // "" means an error
	}{
		{in: []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, want: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{in: []string{`  "abc"  `}, want: "abc"},
		{in: []string{`"a\"b\\c"`}, want: `a"b\c`},
		{in: []string{`"with space"`}, want: "with space"},
		{in: []string{`"k";a=1;b="x";*c=?1;d=tok/en:1;e=:aGk=:;f=-1.5;g`}, want: "k"},
		{in: []string{`"k"; a=1`}, want: "k"},
		{in: []string{`abc`}, allowRaw: true, want: "abc"},
		{in: []string{`8e03978e-40d5`}, allowRaw: true, want: "8e03978e-40d5"},
		{in: []string{`"quoted"`}, allowRaw: true, want: "quoted"},
		{in: []string{`abc`}},
		{in: []string{`a b`}, allowRaw: true},
		{in: []string{`a;b`}, allowRaw: true},
		{in: []string{`""`}},
		{in: []string{``}},
		{in: []string{`"abc`}},
		{in: []string{`"abc\`}},
		{in: []string{`"a\tb"`}},
		{in: []string{"\"a\tb\""}},
		{in: []string{"\"caf\xc3\xa9\""}},
		{in: []string{`"a" "b"`}},
		{in: []string{`"a","b"`}},
		{in: []string{`"a"`, `"b"`}},
		{in: []string{`"k";A=1`}},
		{in: []string{`"k";a=`}},
		{in: []string{`"k";a=1.2345`}},
		{in: []string{`"k";a=1234567890123456`}},
		{in: []string{`"k";a=:no-close`}},
		{in: []string{`"k";a=?2`}},
		{in: []string{`"` + strings.Repeat("x", MaxKeyLength) + `"`}, want: strings.Repeat("x", MaxKeyLength)},
		{in: []string{`"` + strings.Repeat("x", MaxKeyLength+1) + `"`}},
	} {
		got, err := parseKey(tc.in, tc.allowRaw)
		if tc.want == "" {
			require.ErrorIs(t, err, ErrInvalidKey, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		require.Equal(t, tc.want, got, "%q", tc.in)
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"abc"`, `"a\"b";x=1`, `abc`, `"k";a=:aGk=:`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := parseKey([]string{s}, false)
		if err != nil {
			return
		}
		if k == "" || len(k) > MaxKeyLength {
			t.Fatalf("parseKey(%q) = %q", s, k)
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x20 || k[i] > 0x7e {
				t.Fatalf("parseKey(%q) returned a non-printable key %q", s, k)
			}
		}
	})
}

func TestRequestKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		header []string
		want   string // "" means an error
	}{
		{[]string{`"tf1_ab"`}, "tf1_ab"},
		{[]string{`tf1_ab`}, "tf1_ab"},
		{nil, ""},
		{[]string{`a b`}, ""},
		{[]string{`"a"`, `"b"`}, ""},
	} {
		r, err := http.NewRequest(http.MethodPost, "http://x/", nil)
		require.NoError(t, err)
		for _, h := range tc.header {
			r.Header.Add(KeyHeader, h)
		}
		got, err := RequestKey(r)
		if tc.want == "" {
			require.ErrorIs(t, err, ErrInvalidKey, "%q", tc.header)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
}
