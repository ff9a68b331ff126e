package fence_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fence-dev/fence"
)

func TestTokenRoundTrip(t *testing.T) {
	for _, tok := range []fence.Token{
		{Scope: "orders", Value: 1},
		{Scope: "orders/shard-7", Value: 42},
		{Scope: "a.b_c-d/e", Value: 1<<53 + 1}, // above float64's exact range: must stay exact
		{Scope: strings.Repeat("x", fence.MaxScopeLen), Value: fence.MaxToken},
	} {
		s := tok.String()
		got, err := fence.ParseToken(s)
		if err != nil {
			t.Fatalf("ParseToken(%q): %v", s, err)
		}
		if got != tok {
			t.Fatalf("ParseToken(%q) = %+v, want %+v", s, got, tok)
		}
	}
}

func TestParseTokenRejects(t *testing.T) {
	for _, tc := range []struct{ in, field, want string }{
		{"", "token", `must start with "fence:"`},
		{"41", "token", `must start with "fence:"`},
		{"lock:v1:a:1", "token", "not a fence token"},
		{"fence:v2:a:1", "token", `version "v2"`},
		{"fence:", "token", "no version"},
		{"fence:v1:a", "token", "no value"},
		{"fence:v1::1", "scope", "empty"},
		{"fence:v1:a:", "token", "value is empty"},
		{"fence:v1:a:0", "token", "from 1 to"},
		{"fence:v1:a:-1", "token", "not a decimal integer"},
		{"fence:v1:a:+5", "token", "not a decimal integer"},
		{"fence:v1:a:007", "token", "leading zeros"},
		{"fence:v1:a:1e309", "token", "not a decimal integer"},
		{"fence:v1:a:9223372036854775808", "token", "above the maximum"},
		{"fence:v1:a:18446744073709551616", "token", "above the maximum"},
		{"fence:v1:a:99999999999999999999999", "token", "above the maximum"},
		{"fence:v1:a b:1", "scope", "' '"},
		{"fence:v1:a\x00b:1", "scope", "0x00"},
		{"fence:v1:../etc:1", "scope", `".."`},
		{"fence:v1:" + strings.Repeat("a", 1<<20) + ":1", "token", "at most"},
	} {
		_, err := fence.ParseToken(tc.in)
		if !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("ParseToken(%.40q) = %v, want ErrInvalid", tc.in, err)
			continue
		}
		var ie *fence.InvalidError
		if !errors.As(err, &ie) || ie.Field != tc.field || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseToken(%.40q) = %v (field %q), want field %q and %q in the message", tc.in, err, ie.Field, tc.field, tc.want)
		}
		if len(err.Error()) > 400 {
			t.Errorf("ParseToken(%.40q): the message is %d bytes; a hostile input must not end up whole in it", tc.in, len(err.Error()))
		}
	}
}

func TestTokenLess(t *testing.T) {
	a41, a42, b1 := fence.Token{Scope: "a", Value: 41}, fence.Token{Scope: "a", Value: 42}, fence.Token{Scope: "b", Value: 1}
	if !a41.Less(a42) || a42.Less(a41) || a41.Less(a41) {
		t.Error("Less does not order tokens of one scope")
	}
	if a41.Less(b1) || b1.Less(a42) {
		t.Error("Less orders tokens of different scopes")
	}
}

func TestValidateScope(t *testing.T) {
	valid := []string{"a", "orders", "orders/shard-7", "A.b_c-d", "x/.y/..z", strings.Repeat("s", 256)}
	for _, s := range valid {
		if err := fence.ValidateScope(s); err != nil {
			t.Errorf("ValidateScope(%q) = %v", s, err)
		}
	}
	invalid := []string{"", strings.Repeat("s", 257), strings.Repeat("s", 1<<20), "a b", "a\x00", "a:b", "é",
		"\xff", "/a", "a/", "a//b", ".", "..", "../x", "a/./b", "a/..", "a\n"}
	for _, s := range invalid {
		err := fence.ValidateScope(s)
		var ie *fence.InvalidError
		if !errors.As(err, &ie) || ie.Field != "scope" || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("ValidateScope(%.40q) = %v, want an InvalidError for scope", s, err)
		}
	}
	if err := fence.ValidatePrefix(""); err != nil {
		t.Errorf("empty prefix: %v", err)
	}
	if err := fence.ValidatePrefix("orders/"); err != nil {
		t.Errorf("orders/: %v", err)
	}
	if err := fence.ValidatePrefix("a b"); err == nil {
		t.Error("prefix with a space accepted")
	}
}

func TestValidateHolder(t *testing.T) {
	for _, h := range []string{"", "worker-3@host", "Jürgen's laptop", strings.Repeat("h", 128)} {
		if err := fence.ValidateHolder(h); err != nil {
			t.Errorf("ValidateHolder(%q) = %v", h, err)
		}
	}
	for _, h := range []string{strings.Repeat("h", 129), "a\x00", "tab\there", "\xff\xfe", "del\x7f"} {
		if err := fence.ValidateHolder(h); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("ValidateHolder(%.40q) = %v, want ErrInvalid", h, err)
		}
	}
}

func TestLeaseID(t *testing.T) {
	a, b := fence.NewLeaseID(), fence.NewLeaseID()
	if a.IsZero() || a == b {
		t.Fatalf("NewLeaseID gave %s and %s", a, b)
	}
	got, err := fence.ParseLeaseID(a.String())
	if err != nil || got != a {
		t.Fatalf("ParseLeaseID(%s) = %s, %v", a, got, err)
	}
	js, err := json.Marshal(map[string]fence.LeaseID{"id": a})
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]fence.LeaseID
	if err := json.Unmarshal(js, &back); err != nil || back["id"] != a {
		t.Fatalf("JSON round trip: %s -> %v, %v", js, back, err)
	}
	for _, bad := range []string{"", "zz", strings.Repeat("g", 32), strings.Repeat("0", 32), strings.Repeat("a", 33), strings.Repeat("a", 1<<20)} {
		if _, err := fence.ParseLeaseID(bad); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("ParseLeaseID(%.40q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestStructuredErrorsUnwrap(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{&fence.HeldError{Scope: "a", Holder: "h", Token: 3}, fence.ErrHeld},
		{&fence.LostError{Scope: "a", Token: 3, Current: 4}, fence.ErrLeaseLost},
		{&fence.InvalidError{Field: "ttl", Reason: "zero"}, fence.ErrInvalid},
	} {
		wrapped := fmt.Errorf("acquire %q: %w", "a", tc.err)
		if !errors.Is(wrapped, tc.want) {
			t.Errorf("%T does not match %v through wrapping", tc.err, tc.want)
		}
	}
	var held *fence.HeldError
	if err := fmt.Errorf("x: %w", &fence.HeldError{Holder: "h", Token: 7}); !errors.As(err, &held) || held.Token != 7 {
		t.Errorf("errors.As HeldError failed: %v", err)
	}
}

func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"fence:v1:orders:41", "fence:v1:a/b:9223372036854775807", "fence:v2:a:1", "fence:v1:a:01", "", "fence:v1:a:b:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := fence.ParseToken(s)
		if err != nil {
			if !errors.Is(err, fence.ErrInvalid) {
				t.Fatalf("ParseToken(%q): error %v does not match ErrInvalid", s, err)
			}
			return
		}
		// The text form is canonical: what parses prints back the same.
		if tok.String() != s {
			t.Fatalf("ParseToken(%q) = %+v, which prints as %q", s, tok, tok.String())
		}
		if tok.Value == 0 || tok.Value > fence.MaxToken {
			t.Fatalf("ParseToken(%q) accepted value %d", s, tok.Value)
		}
	})
}
