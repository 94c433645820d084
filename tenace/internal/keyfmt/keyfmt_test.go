package keyfmt

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"", `""`},
		{"job-7", `"job-7"`},
		{"a\"b\x00\xff", `"a\"b\x00\xff"`},
		{strings.Repeat("k", Max), `"` + strings.Repeat("k", Max) + `"`},
		{strings.Repeat("k", Max+1), `"` + strings.Repeat("k", Max) + `"… (257 bytes)`},
		{strings.Repeat("k", 10<<20), `"` + strings.Repeat("k", Max) + `"… (10485760 bytes)`},
		// A 3-byte rune across the cut is left out whole, not split into
		// escapes of its first bytes.
		{strings.Repeat("k", Max-1) + "€x", `"` + strings.Repeat("k", Max-1) + `"… (259 bytes)`},
	} {
		got := Quote(tc.key)
		if got != tc.want {
			t.Errorf("Quote(%d bytes) = %.80q…, want %.80q…", len(tc.key), got, tc.want)
		}
		if !utf8.ValidString(got) {
			t.Errorf("Quote(%d bytes) is not valid UTF-8", len(tc.key))
		}
	}
}
