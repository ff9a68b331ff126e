package fence_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fence-dev/fence"
)

// validationCase is one input to a Validate function: valid when allow is
// empty, else refused with a message that says allow.
type validationCase struct {
	name, in, allow string
}

// checkValidation runs validate over the cases. A refusal must be an
// *InvalidError for field that matches fence.ErrInvalid, says what is
// allowed, and stays short whatever the input.
func checkValidation(t testing.TB, validate func(string) error, field string, cases []validationCase) {
	t.Helper()
	for _, tc := range cases {
		err := validate(tc.in)
		if tc.allow == "" {
			if err != nil {
				t.Errorf("%s: %v, want it accepted", tc.name, err)
			}
			continue
		}
		var ie *fence.InvalidError
		switch {
		case err == nil:
			t.Errorf("%s: accepted %.60q", tc.name, tc.in)
		case !errors.Is(err, fence.ErrInvalid) || !errors.As(err, &ie) || ie.Field != field:
			t.Errorf("%s: %v, want an *InvalidError for %q", tc.name, err, field)
		case !strings.Contains(err.Error(), tc.allow):
			t.Errorf("%s: %q does not say %q", tc.name, err, tc.allow)
		case len(err.Error()) > 300:
			t.Errorf("%s: the message is %d bytes long", tc.name, len(err.Error()))
		}
	}
}

const scopeChars = "allowed are ASCII letters, digits, '.', '_', '-' and '/'"

func TestValidateScope(t *testing.T) {
	checkValidation(t, fence.ValidateScope, "scope", []validationCase{
		{"one letter", "a", ""},
		{"segments", "orders/shard-7", ""},
		{"every kind of byte", "AZaz09._-/x", ""},
		{"dots inside names", "x/.y/..z/.../a.", ""},
		{"256 bytes", strings.Repeat("s", 256), ""},
		{"256 bytes of segments", strings.Repeat("a/", 127) + "bc", ""},

		{"empty", "", "want 1 to 256 bytes"},
		{"257 bytes", strings.Repeat("s", 257), "257 bytes long, at most 256 allowed"},
		{"1 MiB", strings.Repeat("s", 1<<20), "1048576 bytes long, at most 256 allowed"},
		{"NUL", "a\x00b", "byte 0x00 at byte 1; " + scopeChars},
		{"newline", "a\n", "byte 0x0a at byte 1"},
		{"DEL", "a\x7f", "byte 0x7f"},
		{"invalid UTF-8", "a\xff\xfe", "byte 0xff at byte 1"},
		{"non-ASCII", "café", "byte 0xc3 at byte 3"},
		{"space", "a b", "' ' at byte 1; " + scopeChars},
		{"colon", "a:b", "':' at byte 1"},
		{"backslash", `a\b`, `'\' at byte 1`},
		{"star", "a/*", "'*' at byte 2"},
		{"..", "..", `".." segment`},
		{"../x", "../x", `".." segment`},
		{"a/..", "a/..", `".." segment`},
		{".", ".", `"." segment`},
		{"a/./b", "a/./b", `"." segment`},
		{"a//b", "a//b", "'/' may not start or end a scope or repeat"},
		{"/a", "/a", "'/' may not start or end a scope or repeat"},
		{"a/", "a/", "'/' may not start or end a scope or repeat"},
		{"/", "/", "'/' may not start or end a scope or repeat"},
	})
}

// TestValidatePrefix: a prefix only selects scopes in a listing, so it is
// checked for its bytes and length, not its segments: "a/", "a//", "." and
// "../" are accepted (and match what they match).
func TestValidatePrefix(t *testing.T) {
	checkValidation(t, fence.ValidatePrefix, "prefix", []validationCase{
		{"empty", "", ""},
		{"a scope", "orders/shard-7", ""},
		{"ending in /", "orders/", ""},
		{"/", "/", ""},
		{"a//", "a//", ""},
		{".", ".", ""},
		{"../", "../", ""},
		{"256 bytes", strings.Repeat("p", 256), ""},

		{"257 bytes", strings.Repeat("p", 257), "257 bytes long, at most 256 allowed"},
		{"1 MiB", strings.Repeat("p", 1<<20), "at most 256 allowed"},
		{"NUL", "a\x00", "byte 0x00 at byte 1; " + scopeChars},
		{"invalid UTF-8", "\xff", "byte 0xff at byte 0"},
		{"non-ASCII", "ü", "byte 0xc3 at byte 0"},
		{"space", "a b", "' ' at byte 1"},
		{"star", "orders/*", "'*' at byte 7"},
	})
}

func TestValidateHolder(t *testing.T) {
	checkValidation(t, fence.ValidateHolder, "holder", []validationCase{
		{"empty", "", ""},
		{"name@host", "worker-3@host", ""},
		{"spaces and punctuation", "Jürgen's laptop (pid 42) ../x //", ""},
		{"non-ASCII", "工人-3 😀", ""},
		{"128 bytes", strings.Repeat("h", 128), ""},
		{"128 bytes, two per rune", strings.Repeat("é", 64), ""},

		{"129 bytes", strings.Repeat("h", 129), "129 bytes long, at most 128 allowed"},
		{"129 bytes, runes cut short", strings.Repeat("é", 64) + "x", "at most 128 allowed"},
		{"1 MiB", strings.Repeat("h", 1<<20), "at most 128 allowed"},
		{"invalid UTF-8", "w\xff\xfe", "is not valid UTF-8"},
		{"a lone continuation byte", "w\x80", "is not valid UTF-8"},
		{"NUL", "w\x00", "contains a control character"},
		{"tab", "w\t1", "contains a control character"},
		{"newline", "w\n1", "contains a control character"},
		{"carriage return", "w\r1", "contains a control character"},
		{"terminal escape", "\x1b[31mred", "contains a control character"},
		{"DEL", "w\x7f", "contains a control character"},
	})
}

// TestValidateHolderRefusesC1Controls: ValidateHolder documents "UTF-8
// without control characters", and U+0080 to U+009F are control
// characters (Unicode category Cc, unicode.IsControl) just as U+0000 to
// U+001F are. A holder is written into logs and fencectl's output; U+0085
// is a line break to many log viewers and U+009B is the 8-bit CSI that
// some terminals act on.
func TestValidateHolderRefusesC1Controls(t *testing.T) {
	checkValidation(t, fence.ValidateHolder, "holder", []validationCase{
		{"U+0080", "w\u0080", "contains a control character"},
		{"NEL, U+0085", "w-1\u0085forged log line", "contains a control character"},
		{"CSI, U+009B", "\u009b31mred", "contains a control character"},
		{"U+009F", "w\u009f", "contains a control character"},
	})
}
