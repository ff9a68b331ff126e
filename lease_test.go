package fence_test

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fence-dev/fence"
)

func TestNewLeaseIDIsRandomAndNonZero(t *testing.T) {
	seen := map[fence.LeaseID]bool{}
	for range 10000 {
		id := fence.NewLeaseID()
		if id.IsZero() {
			t.Fatal("NewLeaseID returned the zero ID")
		}
		if seen[id] {
			t.Fatalf("NewLeaseID returned %s twice", id)
		}
		seen[id] = true
	}
}

func TestLeaseIDText(t *testing.T) {
	lowerHex := regexp.MustCompile(`^[0-9a-f]{32}$`)
	for _, id := range []fence.LeaseID{
		fence.NewLeaseID(),
		{15: 1},
		{0: 0xff, 15: 0xab},
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
	} {
		s := id.String()
		if !lowerHex.MatchString(s) {
			t.Errorf("%x.String() = %q, want 32 lower-case hex digits", id[:], s)
		}
		got, err := fence.ParseLeaseID(s)
		if err != nil || got != id {
			t.Errorf("ParseLeaseID(%q) = %s, %v; want %s", s, got, err, s)
		}
		text, err := id.MarshalText()
		if err != nil || string(text) != s {
			t.Errorf("MarshalText() = %q, %v; want %q", text, err, s)
		}
		var back fence.LeaseID
		if err := back.UnmarshalText(text); err != nil || back != id {
			t.Errorf("UnmarshalText(%q) = %s, %v", text, back, err)
		}
	}
	if got := (fence.LeaseID{}).String(); got != strings.Repeat("0", 32) {
		t.Errorf("the zero ID prints as %q", got)
	}
}

// TestLeaseIDFingerprint: the fingerprint is the first 8 bytes of the
// SHA-256 of the ID's 16 bytes, in hex (so another implementation can
// compute it), shares no digits with the ID where a prefix would, and is
// empty for the zero ID.
func TestLeaseIDFingerprint(t *testing.T) {
	id := fence.LeaseID{0: 0xab, 8: 0xcd, 15: 0xef}
	if got, want := id.Fingerprint(), "c4b530b82a6fee60"; got != want {
		t.Errorf("Fingerprint() = %q, want %q", got, want)
	}
	other := fence.NewLeaseID()
	if f := other.Fingerprint(); len(f) != 16 || strings.HasPrefix(other.String(), f[:8]) || f == id.Fingerprint() {
		t.Errorf("%s has the fingerprint %q", other, f)
	}
	if got := (fence.LeaseID{}).Fingerprint(); got != "" {
		t.Errorf("the zero ID's fingerprint is %q, want empty", got)
	}
}

// TestParseLeaseIDAcceptsUpperCase documents a leniency: hex.Decode reads
// either case, so an upper-case ID parses to the same ID, which prints in
// lower case. The text form of a LeaseID is therefore not canonical on
// input; compare IDs, never their text.
func TestParseLeaseIDAcceptsUpperCase(t *testing.T) {
	id := fence.LeaseID{0: 0xab, 8: 0xcd, 15: 0xef}
	for _, s := range []string{"AB00000000000000CD000000000000EF", "Ab00000000000000cD000000000000eF"} {
		got, err := fence.ParseLeaseID(s)
		if err != nil || got != id {
			t.Errorf("ParseLeaseID(%q) = %s, %v; want %s", s, got, err, id)
		}
		if got.String() == s {
			t.Errorf("%q prints back as itself; expected lower case", s)
		}
	}
}

func TestParseLeaseIDRejects(t *testing.T) {
	for _, tc := range []struct{ name, in, says string }{
		{"empty", "", "is 0 characters; want 32 hexadecimal digits"},
		{"31 digits", strings.Repeat("a", 31), "is 31 characters"},
		{"33 digits", strings.Repeat("a", 33), "is 33 characters"},
		{"16 bytes of text", "0123456789abcdef", "is 16 characters"},
		{"UUID form", "01234567-89ab-cdef-0123-456789abcdef", "is 36 characters"},
		{"1 MiB", strings.Repeat("a", 1<<20), "is 1048576 characters"},
		{"not hex", strings.Repeat("g", 32), "is not 32 hexadecimal digits"},
		{"0x prefix", "0x" + strings.Repeat("a", 30), "is not 32 hexadecimal digits"},
		{"a space", strings.Repeat("a", 31) + " ", "is not 32 hexadecimal digits"},
		{"a NUL", strings.Repeat("a", 31) + "\x00", "is not 32 hexadecimal digits"},
		{"non-ASCII", strings.Repeat("a", 30) + "é", "is not 32 hexadecimal digits"},
		{"the zero ID", strings.Repeat("0", 32), "the zero ID is never issued"},
	} {
		id, err := fence.ParseLeaseID(tc.in)
		var ie *fence.InvalidError
		switch {
		case err == nil:
			t.Errorf("%s: ParseLeaseID(%.40q) = %s, want an error", tc.name, tc.in, id)
		case !id.IsZero():
			t.Errorf("%s: ParseLeaseID returned %s with its error", tc.name, id)
		case !errors.Is(err, fence.ErrInvalid) || !errors.As(err, &ie) || ie.Field != "lease_id":
			t.Errorf("%s: %v, want an *InvalidError for lease_id", tc.name, err)
		case !strings.Contains(err.Error(), tc.says):
			t.Errorf("%s: %q does not say %q", tc.name, err, tc.says)
		case len(err.Error()) > 200:
			t.Errorf("%s: the message is %d bytes long", tc.name, len(err.Error()))
		}
	}
}

func TestLeaseIDJSON(t *testing.T) {
	type doc struct {
		ID  fence.LeaseID            `json:"id"`
		IDs map[fence.LeaseID]string `json:"ids"`
	}
	id := fence.LeaseID{0: 0x12, 15: 0x34}
	in := doc{ID: id, IDs: map[fence.LeaseID]string{id: "w"}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"id":"12000000000000000000000000000034","ids":{"12000000000000000000000000000034":"w"}}`
	if string(b) != want {
		t.Fatalf("json.Marshal = %s, want %s", b, want)
	}
	var out doc
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in, out); diff != "" {
		t.Fatalf("JSON round trip (-want +got):\n%s", diff)
	}

	// (The zero ID, 32 zeros, is TestLeaseJSONRoundTrip's business.)
	for _, bad := range []string{`{"id":"zz"}`, `{"id":""}`, `{"id":"` + strings.Repeat("a", 31) + `"}`, `{"ids":{"zz":"w"}}`} {
		var d doc
		err := json.Unmarshal([]byte(bad), &d)
		if !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("json.Unmarshal(%s) = %v, want an error matching fence.ErrInvalid", bad, err)
		}
	}
	// Not a string at all: encoding/json's own type error.
	var d doc
	if err := json.Unmarshal([]byte(`{"id":12}`), &d); err == nil {
		t.Error("json.Unmarshal of a number as a lease ID succeeded")
	}
	// null leaves the ID alone, as encoding/json does for every type.
	d = doc{ID: id}
	if err := json.Unmarshal([]byte(`{"id":null}`), &d); err != nil || d.ID != id {
		t.Errorf("json.Unmarshal of null = %s, %v; want the ID unchanged", d.ID, err)
	}
}

// TestLeaseJSONRoundTrip: a fence.Lease is a plain value users log, cache
// and send as JSON. As get and list report it, its ID is zero ("zero when
// the service does not disclose it").
func TestLeaseJSONRoundTrip(t *testing.T) {
	for _, l := range []fence.Lease{
		{Scope: "orders", Token: 7, ID: fence.NewLeaseID(), Holder: "w", TTL: time.Second, ExpiresIn: time.Millisecond},
		{Scope: "orders", Token: 7, Holder: "w", TTL: time.Second}, // from get or list
	} {
		b, err := json.Marshal(l)
		if err != nil {
			t.Errorf("json.Marshal(%+v): %v", l, err)
			continue
		}
		var back fence.Lease
		if err := json.Unmarshal(b, &back); err != nil {
			t.Errorf("json.Unmarshal(%s): %v", b, err)
			continue
		}
		if back != l {
			t.Errorf("JSON round trip of %+v gave %+v", l, back)
		}
	}
}
