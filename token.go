package fence

import (
	"encoding/base64"
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

	// A signed token also carries the grant's lease ID and the service's
	// Ed25519 signature over scope, value and lease ID, made with the key
	// named KeyID. Guards that know the service's public keys refuse a
	// token whose signature does not verify (package signing). Sig is the
	// raw 64-byte signature; all three are empty for an unsigned token.
	LeaseID LeaseID
	KeyID   string
	Sig     string
}

// Signed reports whether t carries a signature.
func (t Token) Signed() bool { return t.Sig != "" }

// Unsigned returns t without its signature: the scope and value only.
func (t Token) Unsigned() Token { return Token{Scope: t.Scope, Value: t.Value} }

// SignedPayload returns the bytes a signature of t covers. The fixed
// prefix keeps a token signature from being valid as anything else.
func (t Token) SignedPayload() []byte {
	return []byte("fence-token-v2\x00" + t.Scope + "\x00" + strconv.FormatUint(t.Value, 10) + "\x00" + t.LeaseID.String())
}

// String returns the token's text form, for headers, environment variables
// and logs: "fence:v1:SCOPE:VALUE" unsigned, and
// "fence:v2:SCOPE:VALUE:LEASE_ID:KEY_ID:SIGNATURE" signed (the signature in
// unpadded base64url). ParseToken reads both back.
func (t Token) String() string {
	if t.Signed() {
		return tokenPrefix + "v2:" + t.Scope + ":" + strconv.FormatUint(t.Value, 10) + ":" + t.LeaseID.String() + ":" + t.KeyID + ":" + base64.RawURLEncoding.EncodeToString([]byte(t.Sig))
	}
	return tokenPrefix + "v1:" + t.Scope + ":" + strconv.FormatUint(t.Value, 10)
}

// MaxKeyIDLen bounds a signing key's ID.
const MaxKeyIDLen = 32

// ValidateKeyID reports whether id can name a signing key: 1 to 32 of
// a-z, 0-9 and '-'.
func ValidateKeyID(id string) error {
	if id == "" || len(id) > MaxKeyIDLen {
		return invalid("key_id", "%d bytes long; want 1 to %d of a-z, 0-9 and '-'", len(id), MaxKeyIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return invalid("key_id", "%s has a character other than a-z, 0-9 and '-'", quoteShort(id))
		}
	}
	return nil
}

// Less reports whether t is an older generation than u of the same scope.
// Tokens of different scopes are unordered and Less reports false.
func (t Token) Less(u Token) bool {
	return t.Scope == u.Scope && t.Value < u.Value
}

// ParseToken parses a token's text form: version 1,
// "fence:v1:SCOPE:VALUE", where SCOPE obeys ValidateScope and VALUE is a
// decimal integer from 1 to MaxToken without sign or leading zeros, or
// version 2, the signed form (see Token.String). Parsing does not verify a
// signature: that needs the service's public keys (package signing).
func ParseToken(s string) (Token, error) {
	const maxLen = len(tokenPrefix) + len("v2:") + MaxScopeLen + 1 + 19 + 1 + 32 + 1 + MaxKeyIDLen + 1 + 86
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
	switch version {
	case "v1":
	case "v2":
		return parseSigned(s, rest)
	default:
		return Token{}, invalid("token", "%q has version %q; this build reads v1 and v2", s, version)
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

// parseSigned reads the rest of a v2 token: SCOPE:VALUE:LEASE_ID:KEY_ID:SIG.
// The scope cannot contain ':', so the fields split unambiguously.
func parseSigned(s, rest string) (Token, error) {
	f := strings.Split(rest, ":")
	if len(f) != 5 {
		return Token{}, invalid("token", "%s has %d fields after the version; want fence:v2:SCOPE:VALUE:LEASE_ID:KEY_ID:SIGNATURE", quoteShort(s), len(f))
	}
	if err := ValidateScope(f[0]); err != nil {
		return Token{}, err
	}
	v, err := parseValue(f[1])
	if err != nil {
		return Token{}, err
	}
	// Errors name the token as the bad field: the lease ID and key ID are
	// parts of it here, not fields of a request.
	id, err := ParseLeaseID(f[2])
	if err != nil {
		return Token{}, invalid("token", "lease ID %s is not 32 hexadecimal digits of a lease", quoteShort(f[2]))
	}
	if ValidateKeyID(f[3]) != nil {
		return Token{}, invalid("token", "key ID %s is not 1 to %d of a-z, 0-9 and '-'", quoteShort(f[3]), MaxKeyIDLen)
	}
	sig, err := base64.RawURLEncoding.Strict().DecodeString(f[4])
	if err != nil || len(sig) != 64 {
		return Token{}, invalid("token", "signature %s is not 64 bytes in unpadded base64url", quoteShort(f[4]))
	}
	return Token{Scope: f[0], Value: v, LeaseID: id, KeyID: f[3], Sig: string(sig)}, nil
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
