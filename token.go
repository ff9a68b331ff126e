package fence

import (
	"math"
	"strconv"
	"strings"
)

// MaxToken is the greatest token the service issues. It fits a signed 64-bit
// column, so guards can keep tokens in a database BIGINT.
const MaxToken = math.MaxInt64

// tokenPrefix starts every token's text form; the version follows it.
const tokenPrefix = "fence:"

// Token is a fencing token: the generation of one grant of a scope. Later
// grants of the same scope have greater values; a renewal keeps the value.
// A token is meaningful only together with its scope. Token is a value type,
// safe for concurrent use.
type Token struct {
	Scope string
	Value uint64
}

// String returns the token's text form, "fence:v1:SCOPE:VALUE", for headers,
// environment variables and logs. ParseToken reads it back.
func (t Token) String() string {
	return tokenPrefix + "v1:" + t.Scope + ":" + strconv.FormatUint(t.Value, 10)
}

// Less reports whether t is an older generation than u of the same scope.
// Tokens of different scopes are unordered and Less reports false.
func (t Token) Less(u Token) bool {
	return t.Scope == u.Scope && t.Value < u.Value
}

// ParseToken parses a token's text form. It accepts version 1,
// "fence:v1:SCOPE:VALUE", where SCOPE obeys ValidateScope and VALUE is a
// decimal integer from 1 to MaxToken without sign or leading zeros. The
// version field leaves room for later forms (a signed one) that will keep
// this one readable.
func ParseToken(s string) (Token, error) {
	const maxLen = len(tokenPrefix) + len("v1:") + MaxScopeLen + 1 + 19
	if len(s) > maxLen {
		return Token{}, invalid("token", "text form is %d bytes, at most %d allowed", len(s), maxLen)
	}
	rest, ok := strings.CutPrefix(s, tokenPrefix)
	if !ok {
		return Token{}, invalid("token", "%q is not a fence token: it must start with %q", s, tokenPrefix)
	}
	version, rest, ok := strings.Cut(rest, ":")
	if !ok {
		return Token{}, invalid("token", "%q has no version: want fence:v1:SCOPE:VALUE", s)
	}
	if version != "v1" {
		return Token{}, invalid("token", "%q has version %q; this build reads v1", s, version)
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return Token{}, invalid("token", "%q has no value: want fence:v1:SCOPE:VALUE", s)
	}
	scope, num := rest[:i], rest[i+1:]
	if err := ValidateScope(scope); err != nil {
		return Token{}, err
	}
	v, err := parseValue(num)
	if err != nil {
		return Token{}, err
	}
	return Token{Scope: scope, Value: v}, nil
}

// parseValue reads a token value strictly: digits only, no leading zero.
func parseValue(num string) (uint64, error) {
	if num == "" {
		return 0, invalid("token", "value is empty: want a decimal integer from 1 to %d", uint64(MaxToken))
	}
	for i := 0; i < len(num); i++ {
		if num[i] < '0' || num[i] > '9' {
			return 0, invalid("token", "value %q is not a decimal integer from 1 to %d", num, uint64(MaxToken))
		}
	}
	if num[0] == '0' {
		return 0, invalid("token", "value %q must be from 1 to %d without leading zeros", num, uint64(MaxToken))
	}
	v, err := strconv.ParseUint(num, 10, 64)
	if err != nil || v > MaxToken {
		return 0, invalid("token", "value %q is above the maximum %d", num, uint64(MaxToken))
	}
	return v, nil
}
