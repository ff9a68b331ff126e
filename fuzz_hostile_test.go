package fence_test

import (
	"strings"
	"testing"

	"github.com/fence-dev/fence"
)

// v1 is an independent reading of the version-1 text form, written from
// its specification rather than from token.go, for FuzzTokenV1: SCOPE is
// 1 to 256 bytes of A-Z a-z 0-9 . _ - /, in '/'-separated segments none of
// which is empty, "." or ".."; VALUE is 1 to 2^63-1 in decimal, without
// sign or leading zeros.
func v1(s string) (fence.Token, bool) {
	rest, ok := strings.CutPrefix(s, "fence:v1:")
	if !ok {
		return fence.Token{}, false
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return fence.Token{}, false
	}
	scope, num := rest[:i], rest[i+1:]
	if len(scope) < 1 || len(scope) > 256 {
		return fence.Token{}, false
	}
	for _, c := range []byte(scope) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-' || c == '/') {
			return fence.Token{}, false
		}
	}
	for _, seg := range strings.Split(scope, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fence.Token{}, false
		}
	}
	const max = "9223372036854775807"
	if num == "" || num[0] == '0' || len(num) > len(max) || len(num) == len(max) && num > max {
		return fence.Token{}, false
	}
	var v uint64
	for _, c := range []byte(num) {
		if c < '0' || c > '9' {
			return fence.Token{}, false
		}
		v = v*10 + uint64(c-'0')
	}
	return fence.Token{Scope: scope, Value: v}, true
}

// FuzzTokenV1 compares ParseToken with v1 on every input of the version-1
// form: both accept it, with the same scope and value, or both refuse it.
// (Other versions are ParseToken's alone; FuzzParseToken covers them.)
func FuzzTokenV1(f *testing.F) {
	for _, s := range []string{
		"fence:v1:orders:1", "fence:v1:a/b.c_d-e:9223372036854775807", "fence:v1:a:9223372036854775808",
		"fence:v1:a:9007199254740993", "fence:v1:a:09", "fence:v1:a:-1", "fence:v1:a:1e309", "fence:v1:a:+1",
		"fence:v1:a/./b:1", "fence:v1:a/../b:1", "fence:v1:/a:1", "fence:v1:a//b:1", "fence:v1:a:b:1",
		"fence:v1::1", "fence:v1:a:", "fence:v1:a\x00:1", "fence:v1:caf\xc3\xa9:1", "fence:v1:a:\xd9\xa1",
		"fence:v1:" + strings.Repeat("s", 256) + ":1", "fence:v1:" + strings.Repeat("s", 257) + ":1",
		"fence:v1:a:99999999999999999999",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !strings.HasPrefix(s, "fence:v1:") {
			s = "fence:v1:" + s
		}
		got, err := fence.ParseToken(s)
		want, ok := v1(s)
		switch {
		case ok && err != nil:
			t.Fatalf("ParseToken(%q) refused a valid token (%+v): %v", s, want, err)
		case !ok && err == nil:
			t.Fatalf("ParseToken(%q) accepted %+v, which the specification refuses", s, got)
		case ok && got != want:
			t.Fatalf("ParseToken(%q) = %+v, want %+v", s, got, want)
		}
	})
}

// FuzzTokenString builds a token from any scope and value: its text form
// parses back to it exactly when the token is one the service could issue,
// and is refused otherwise. A token's String never yields text that reads
// as another token.
func FuzzTokenString(f *testing.F) {
	for _, c := range []struct {
		scope string
		value uint64
	}{
		{"orders", 1}, {"orders/shard-7", 1<<53 + 1}, {"a", fence.MaxToken}, {"a", fence.MaxToken + 1},
		{"a", 0}, {"a:b", 1}, {"", 5}, {"a/../b", 5}, {"a\x00", 5}, {"fence:v1:a", 5},
	} {
		f.Add(c.scope, c.value)
	}
	f.Fuzz(func(t *testing.T, scope string, value uint64) {
		tok := fence.Token{Scope: scope, Value: value}
		s := tok.String()
		got, err := fence.ParseToken(s)
		_, valid := v1("fence:v1:" + scope + ":1")
		valid = valid && value >= 1 && value <= fence.MaxToken
		switch {
		case valid && (err != nil || got != tok):
			t.Fatalf("%+v prints as %q, which parses to %+v, %v", tok, s, got, err)
		case !valid && err == nil:
			t.Fatalf("%+v is no token the service issues, but its text %q parses to %+v", tok, s, got)
		}
	})
}
