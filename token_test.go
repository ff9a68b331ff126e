package fence_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fence-dev/fence"
)

// maxTokenText is fence.MaxToken, 2^63-1, as text.
const maxTokenText = "9223372036854775807"

// longestToken is the longest text form ParseToken accepts: a scope of
// MaxScopeLen bytes and the greatest value.
var longestToken = "fence:v1:" + strings.Repeat("s", fence.MaxScopeLen) + ":" + maxTokenText

func TestTokenTextRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		tok  fence.Token
		text string
	}{
		{fence.Token{Scope: "orders", Value: 1}, "fence:v1:orders:1"},
		{fence.Token{Scope: "orders/shard-7", Value: 42}, "fence:v1:orders/shard-7:42"},
		{fence.Token{Scope: "A.b_c-d/e", Value: 10}, "fence:v1:A.b_c-d/e:10"},
		{fence.Token{Scope: "x/.y/..z/...", Value: 7}, "fence:v1:x/.y/..z/...:7"},
		// Above float64's exact integers: a parser going through float64
		// would answer 2^53.
		{fence.Token{Scope: "a", Value: 1<<53 + 1}, "fence:v1:a:9007199254740993"},
		{fence.Token{Scope: "a", Value: fence.MaxToken}, "fence:v1:a:" + maxTokenText},
		{fence.Token{Scope: strings.Repeat("s", fence.MaxScopeLen), Value: fence.MaxToken}, longestToken},
	} {
		if got := tc.tok.String(); got != tc.text {
			t.Errorf("%#v.String() = %q, want %q", tc.tok, got, tc.text)
		}
		got, err := fence.ParseToken(tc.text)
		if err != nil {
			t.Errorf("ParseToken(%.60q): %v", tc.text, err)
			continue
		}
		if got != tc.tok {
			t.Errorf("ParseToken(%.60q) = %#v, want %#v", tc.text, got, tc.tok)
		}
	}
}

// leaseHex and sig64 are well-formed fields of a signed token's text: a
// lease ID (of the legacy v2 form) and 64 bytes in unpadded base64url.
var (
	leaseHex = "5f0c3a1e9b7d42c68e1f00a4b3c2d1e0"
	sig64    = strings.Repeat("AAAA", 21) + "AA"
)

// TestSignedTokenText: a signed token is written in the v3 form, which
// carries no lease ID, and its signature covers exactly the v3 payload. A
// legacy v2 text still parses, prints back as it was and keeps its v2
// payload, so tokens issued before v3 keep verifying.
func TestSignedTokenText(t *testing.T) {
	sig := string(make([]byte, 64))
	v3 := fence.Token{Scope: "orders/a", Value: fence.MaxToken, KeyID: "k1", Sig: sig}
	const v3Text = "fence:v3:orders/a:" + maxTokenText + ":k1:"
	if got := v3.String(); got != v3Text+sig64 {
		t.Errorf("String() = %q, want %q", got, v3Text+sig64)
	}
	if got, err := fence.ParseToken(v3Text + sig64); err != nil || got != v3 {
		t.Errorf("ParseToken(v3) = %#v, %v; want %#v", got, err, v3)
	}
	if got, want := string(v3.SignedPayload()), "fence-token-v3\x00orders/a\x00"+maxTokenText; got != want {
		t.Errorf("v3 SignedPayload() = %q, want %q", got, want)
	}

	v2Text := "fence:v2:orders/a:42:" + leaseHex + ":k1:" + sig64
	v2, err := fence.ParseToken(v2Text)
	if err != nil {
		t.Fatal(err)
	}
	if v2.Scope != "orders/a" || v2.Value != 42 || v2.KeyID != "k1" || v2.Sig != sig || v2.String() != v2Text {
		t.Errorf("ParseToken(v2) = %#v, printing as %q", v2, v2)
	}
	if got, want := string(v2.SignedPayload()), "fence-token-v2\x00orders/a\x0042\x00"+leaseHex; got != want {
		t.Errorf("v2 SignedPayload() = %q, want %q", got, want)
	}
	// Without its signature a v2 token is the plain scope and value.
	if got, want := v2.Unsigned(), (fence.Token{Scope: "orders/a", Value: 42}); got != want {
		t.Errorf("v2 Unsigned() = %#v, want %#v", got, want)
	}
}

func TestParseTokenRejects(t *testing.T) {
	// What each kind of message must say is allowed.
	const (
		prefix  = `must start with "fence:"`
		form    = "want fence:v1:SCOPE:VALUE"
		version = "this build reads v1, v2 and v3"
		value   = "from 1 to " + maxTokenText
		above   = "above the maximum " + maxTokenText
		chars   = "allowed are ASCII letters, digits, '.', '_', '-' and '/'"
		segment = "'/' may not start or end a scope or repeat"
	)
	v := func(num string) string { return "fence:v1:a:" + num }
	s := func(scope string) string { return "fence:v1:" + scope + ":1" }
	for _, tc := range []struct {
		name, in     string
		field, allow string // the InvalidError field, and what its message must say
	}{
		{"empty", "", "token", prefix},
		{"a bare number", "41", "token", prefix},
		{"another prefix", "lock:v1:a:1", "token", prefix},
		{"upper-case prefix", "FENCE:v1:a:1", "token", prefix},
		{"leading space", " fence:v1:a:1", "token", prefix},
		{"leading NUL", "\x00fence:v1:a:1", "token", prefix},
		{"prefix only", "fence:", "token", form},
		{"version only", "fence:v1", "token", form},
		{"no value", "fence:v1:a", "token", form},
		{"nothing after the version", "fence:v1:", "token", form},
		{"version 4", "fence:v4:a:1", "token", version},
		{"version 3 without its signature", "fence:v3:a:1", "token", "want fence:v3:SCOPE:VALUE:KEY_ID:SIGNATURE"},
		{"version 3 with a lease ID", "fence:v3:a:1:" + leaseHex + ":k1:" + sig64, "token", "want fence:v3:SCOPE:VALUE:KEY_ID:SIGNATURE"},
		{"version 3, bad key ID", "fence:v3:a:1:K1:" + sig64, "token", "key ID \"K1\" is not 1 to 32 of a-z, 0-9 and '-'"},
		{"version 3, short signature", "fence:v3:a:1:k1:" + sig64[:84], "token", "is not 64 bytes in unpadded base64url"},
		{"version 3, padded signature", "fence:v3:a:1:k1:" + sig64 + "==", "token", "is not 64 bytes in unpadded base64url"},
		{"version 3, value 2^63", "fence:v3:a:9223372036854775808:k1:" + sig64, "token", above},
		{"version 2 without its signature", "fence:v2:a:1", "token", "want fence:v2:SCOPE:VALUE:LEASE_ID:KEY_ID:SIGNATURE"},
		{"version 2 without its lease ID", "fence:v2:a:1:k1:" + sig64, "token", "want fence:v2:SCOPE:VALUE:LEASE_ID:KEY_ID:SIGNATURE"},
		{"version 2, zero lease ID", "fence:v2:a:1:" + strings.Repeat("0", 32) + ":k1:" + sig64, "token", "is not 32 hexadecimal digits of a lease"},
		{"upper-case version", "fence:V1:a:1", "token", version},
		{"empty version", "fence::a:1", "token", version},
		{"version 1.0", "fence:v1.0:a:1", "token", version},

		{"empty value", v(""), "token", value},
		{"zero", v("0"), "token", value},
		{"zeros", v("00"), "token", value},
		{"leading zeros", v("007"), "token", value},
		{"negative", v("-1"), "token", value},
		{"plus sign", v("+5"), "token", value},
		{"decimal point", v("1.0"), "token", value},
		{"exponent", v("1e309"), "token", value},
		{"hex", v("0x10"), "token", value},
		{"underscore", v("1_000"), "token", value},
		{"trailing space", v("1 "), "token", value},
		{"leading space in value", v(" 1"), "token", value},
		{"NUL in value", v("1\x00"), "token", value},
		{"Arabic-Indic digit", v("١"), "token", value},
		{"fullwidth digit", v("１"), "token", value},
		{"2^63, one above the maximum", v("9223372036854775808"), "token", above},
		{"2^64-1", v("18446744073709551615"), "token", above},
		{"2^64", v("18446744073709551616"), "token", above},
		{"thirty digits", v(strings.Repeat("9", 30)), "token", above},

		{"empty scope", s(""), "scope", "want 1 to 256 bytes of letters, digits, '.', '_', '-' and '/'"},
		{"scope with a space", s("a b"), "scope", chars},
		{"scope with a NUL", s("a\x00b"), "scope", chars},
		{"scope with a colon", "fence:v1:a:b:1", "scope", chars},
		{"non-ASCII scope", s("café"), "scope", chars},
		{"scope with invalid UTF-8", s("a\xff"), "scope", chars},
		{"scope ../x", s("../x"), "scope", `".." segment`},
		{"scope .", s("."), "scope", `"." segment`},
		{"scope a/./b", s("a/./b"), "scope", `"." segment`},
		{"scope a//b", s("a//b"), "scope", segment},
		{"scope /a", s("/a"), "scope", segment},
		{"scope a/", s("a/"), "scope", segment},
		{"scope of 257 bytes", s(strings.Repeat("s", fence.MaxScopeLen+1)), "scope", "at most 256 allowed"},

		{"one digit too many", longestToken + "0", "token", "above the maximum"},
		{"1 MiB", "fence:v1:" + strings.Repeat("a", 1<<20) + ":1", "token", "at most 438 allowed"},
		{"1 MiB of NUL", strings.Repeat("\x00", 1<<20), "token", "at most 438 allowed"},
	} {
		tok, err := fence.ParseToken(tc.in)
		if err == nil {
			t.Errorf("%s: ParseToken(%.60q) = %#v, want an error", tc.name, tc.in, tok)
			continue
		}
		if tok != (fence.Token{}) {
			t.Errorf("%s: ParseToken returned %#v with its error", tc.name, tok)
		}
		if !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: %v does not match fence.ErrInvalid", tc.name, err)
		}
		var ie *fence.InvalidError
		if !errors.As(err, &ie) {
			t.Errorf("%s: %v is not a *fence.InvalidError", tc.name, err)
			continue
		}
		if ie.Field != tc.field {
			t.Errorf("%s: %v names field %q, want %q", tc.name, err, ie.Field, tc.field)
		}
		if !strings.Contains(err.Error(), tc.allow) {
			t.Errorf("%s: %q does not say %q", tc.name, err, tc.allow)
		}
		// A hostile input must not end up whole in a log line.
		if len(err.Error()) > 400 {
			t.Errorf("%s: the message is %d bytes long", tc.name, len(err.Error()))
		}
	}
}

func TestTokenLess(t *testing.T) {
	a41, a42, b1 := fence.Token{Scope: "a", Value: 41}, fence.Token{Scope: "a", Value: 42}, fence.Token{Scope: "b", Value: 1}
	for _, tc := range []struct {
		t, u fence.Token
		want bool
	}{
		{a41, a42, true},
		{a42, a41, false},
		{a41, a41, false},
		// Tokens of different scopes are unordered.
		{b1, a42, false},
		{a41, b1, false},
	} {
		if got := tc.t.Less(tc.u); got != tc.want {
			t.Errorf("%v.Less(%v) = %v, want %v", tc.t, tc.u, got, tc.want)
		}
	}
}

func TestLeaseFencingToken(t *testing.T) {
	l := fence.Lease{Scope: "orders", Token: 7, ID: fence.NewLeaseID(), Holder: "w"}
	if got, want := l.FencingToken(), (fence.Token{Scope: "orders", Value: 7}); got != want {
		t.Fatalf("FencingToken() = %#v, want %#v", got, want)
	}
}

// FuzzParseToken: ParseToken never panics, refuses with an *InvalidError,
// and accepts only the canonical text form: what parses prints back the
// same. Seeds are in testdata/fuzz/FuzzParseToken as well.
func FuzzParseToken(f *testing.F) {
	for _, s := range []string{
		"fence:v1:orders:41", "fence:v1:a/b:" + maxTokenText, "fence:v1:a:9007199254740993", longestToken,
		"fence:v3:a:1:k1:" + sig64, "fence:v3:a:" + maxTokenText + ":k1:" + sig64, "fence:v2:a:1:" + leaseHex + ":k1:" + sig64,
		"fence:v3:a:1:" + leaseHex + ":k1:" + sig64, "fence:v3:a:1", "fence:v2:a:1", "fence:v1:a:01", "fence:v1:a:+1", "fence:v1:a:9223372036854775808", "", "fence:v1:a:b:1",
		"fence:v1:../a:1", "fence:v1:a\x00:1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := fence.ParseToken(s)
		if err != nil {
			var ie *fence.InvalidError
			if !errors.Is(err, fence.ErrInvalid) || !errors.As(err, &ie) || (ie.Field != "token" && ie.Field != "scope") {
				t.Fatalf("ParseToken(%q): error %v is not an InvalidError for token or scope", s, err)
			}
			if tok != (fence.Token{}) {
				t.Fatalf("ParseToken(%q) returned %#v with its error", s, tok)
			}
			return
		}
		if got := tok.String(); got != s {
			t.Fatalf("ParseToken(%q) = %#v, which prints as %q", s, tok, got)
		}
		if tok.Value == 0 || tok.Value > fence.MaxToken {
			t.Fatalf("ParseToken(%q) accepted the value %d", s, tok.Value)
		}
		if err := fence.ValidateScope(tok.Scope); err != nil {
			t.Fatalf("ParseToken(%q) accepted the scope %q: %v", s, tok.Scope, err)
		}
	})
}
