package fence

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on the names a request carries.
const (
	MaxScopeLen  = 256 // bytes
	MaxHolderLen = 128 // bytes
)

// ValidateScope reports whether s is a valid scope name: 1 to 256 bytes of
// ASCII letters, digits and the characters '.', '_', '-' and '/'; '/'
// separates non-empty segments, and no segment is "." or "..". Scopes are
// compared byte for byte. The error is an *InvalidError that says what is
// allowed.
func ValidateScope(s string) error {
	switch {
	case s == "":
		return invalid("scope", "empty; want 1 to %d bytes of letters, digits, '.', '_', '-' and '/'", MaxScopeLen)
	case len(s) > MaxScopeLen:
		return invalid("scope", "%d bytes long, at most %d allowed", len(s), MaxScopeLen)
	}
	for i := 0; i < len(s); i++ {
		if !scopeByte(s[i]) {
			return invalid("scope", "%s has %s at byte %d; allowed are ASCII letters, digits, '.', '_', '-' and '/'",
				quoteShort(s), quoteByte(s[i]), i)
		}
	}
	for seg := range strings.SplitSeq(s, "/") {
		switch seg {
		case "":
			return invalid("scope", "%s has an empty segment; '/' may not start or end a scope or repeat", quoteShort(s))
		case ".", "..":
			return invalid("scope", "%s has a %q segment, which is not allowed", quoteShort(s), seg)
		}
	}
	return nil
}

// ValidatePrefix reports whether p may select scopes in a listing: empty, or
// a string of the characters a scope may contain, at most MaxScopeLen bytes.
func ValidatePrefix(p string) error {
	if len(p) > MaxScopeLen {
		return invalid("prefix", "%d bytes long, at most %d allowed", len(p), MaxScopeLen)
	}
	for i := 0; i < len(p); i++ {
		if !scopeByte(p[i]) {
			return invalid("prefix", "%s has %s at byte %d; allowed are ASCII letters, digits, '.', '_', '-' and '/'",
				quoteShort(p), quoteByte(p[i]), i)
		}
	}
	return nil
}

// ValidateHolder reports whether h is a valid holder name: at most 128
// bytes of UTF-8 without control characters. Empty is allowed.
func ValidateHolder(h string) error {
	if len(h) > MaxHolderLen {
		return invalid("holder", "%d bytes long, at most %d allowed", len(h), MaxHolderLen)
	}
	if !utf8.ValidString(h) {
		return invalid("holder", "%s is not valid UTF-8", quoteShort(h))
	}
	for _, r := range h {
		if unicode.IsControl(r) { // C0, DEL and C1: they forge lines in logs and terminals
			return invalid("holder", "%s contains a control character", quoteShort(h))
		}
	}
	return nil
}

func scopeByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '-' || c == '/'
}

func quoteByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return "'" + string(c) + "'"
	}
	const hex = "0123456789abcdef"
	return "byte 0x" + string(hex[c>>4]) + string(hex[c&15])
}

// quoteShort quotes s for an error message, cutting it if it is long so a
// hostile megabyte does not end up in a log line.
func quoteShort(s string) string {
	const max = 64
	if len(s) > max {
		return strconv.Quote(s[:max]) + "…"
	}
	return strconv.Quote(s)
}
