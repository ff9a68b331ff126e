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

	// A signed token also carries the service's Ed25519 signature over
	// scope and value, made with the key named KeyID. Guards that know the
	// service's public keys refuse a token whose signature does not verify
	// (package signing). Sig is the raw 64-byte signature; both are empty
	// for an unsigned token.
	KeyID string
	Sig   string

	// v2LeaseID is set only for a token parsed from the v2 text form,
	// which carried the grant's lease ID and signed it. It is kept to
	// rebuild the v2 signed payload and text, and not exported: the lease
	// ID renews and releases the lease, so it must not travel with the
	// token (docs/security.md).
	v2LeaseID LeaseID
}

// Signed reports whether t carries a signature.
func (t Token) Signed() bool { return t.Sig != "" }

// Unsigned returns t without its signature: the scope and value only.
func (t Token) Unsigned() Token { return Token{Scope: t.Scope, Value: t.Value} }

// SignedPayload returns the bytes a signature of t covers:
// "fence-token-v3" 0x00 SCOPE 0x00 VALUE, with VALUE in decimal. A scope
// and value are granted together only once, so they name one grant. The
// fixed prefix keeps a token signature from being valid as anything else.
// For a token parsed from the legacy v2 form it is the v2 payload, which
// also covered the lease ID.
func (t Token) SignedPayload() []byte {
	if !t.v2LeaseID.IsZero() {
		return []byte("fence-token-v2\x00" + t.Scope + "\x00" + strconv.FormatUint(t.Value, 10) + "\x00" + t.v2LeaseID.String())
	}
	return []byte("fence-token-v3\x00" + t.Scope + "\x00" + strconv.FormatUint(t.Value, 10))
}

// String returns the token's text form, for headers, environment variables
// and logs: "fence:v1:SCOPE:VALUE" unsigned, and
// "fence:v3:SCOPE:VALUE:KEY_ID:SIGNATURE" signed (the signature in unpadded
// base64url). A token parsed from the legacy v2 form is written back as
// it was read. ParseToken reads them all back.
func (t Token) String() string {
	if !t.Signed() {
		return tokenPrefix + "v1:" + t.Scope + ":" + strconv.FormatUint(t.Value, 10)
	}
	sig := base64.RawURLEncoding.EncodeToString([]byte(t.Sig))
	if !t.v2LeaseID.IsZero() {
		return tokenPrefix + "v2:" + t.Scope + ":" + strconv.FormatUint(t.Value, 10) + ":" + t.v2LeaseID.String() + ":" + t.KeyID + ":" + sig
	}
	return tokenPrefix + "v3:" + t.Scope + ":" + strconv.FormatUint(t.Value, 10) + ":" + t.KeyID + ":" + sig
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
// decimal integer from 1 to MaxToken without sign or leading zeros;
// version 3, the signed form (see Token.String); or version 2, the signed
// form fenced issued before v3, still read so that tokens handed out
// before an upgrade keep verifying. Parsing does not verify a signature:
// that needs the service's public keys (package signing).
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
		return Token{}, invalid("token", "%q has no version: want fence:v1:SCOPE:VALUE or fence:v3:SCOPE:VALUE:KEY_ID:SIGNATURE", s)
	}
	switch version {
	case "v1":
	case "v2":
		return parseV2(s, rest)
	case "v3":
		return parseV3(s, rest)
	default:
		return Token{}, invalid("token", "%q has version %q; this build reads v1, v2 and v3", s, version)
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

// parseV3 reads the rest of a v3 token: SCOPE:VALUE:KEY_ID:SIG. The scope
// cannot contain ':', so the fields split unambiguously.
func parseV3(s, rest string) (Token, error) {
	f := strings.Split(rest, ":")
	if len(f) != 4 {
		return Token{}, invalid("token", "%s has %d fields after the version; want fence:v3:SCOPE:VALUE:KEY_ID:SIGNATURE", quoteShort(s), len(f))
	}
	return parseSigned(f[0], f[1], f[2], f[3])
}

// parseV2 reads the rest of a legacy v2 token:
// SCOPE:VALUE:LEASE_ID:KEY_ID:SIG. The lease ID is kept only to rebuild
// the v2 signed payload.
func parseV2(s, rest string) (Token, error) {
	f := strings.Split(rest, ":")
	if len(f) != 5 {
		return Token{}, invalid("token", "%s has %d fields after the version; want fence:v2:SCOPE:VALUE:LEASE_ID:KEY_ID:SIGNATURE", quoteShort(s), len(f))
	}
	t, err := parseSigned(f[0], f[1], f[3], f[4])
	if err != nil {
		return Token{}, err
	}
	// Errors name the token as the bad field: the lease ID is part of it
	// here, not a field of a request.
	id, err := ParseLeaseID(f[2])
	if err != nil {
		return Token{}, invalid("token", "lease ID %s is not 32 hexadecimal digits of a lease", quoteShort(f[2]))
	}
	t.v2LeaseID = id
	return t, nil
}

// parseSigned checks the fields that v2 and v3 share.
func parseSigned(scope, value, keyID, sig string) (Token, error) {
	if err := ValidateScope(scope); err != nil {
		return Token{}, err
	}
	v, err := parseValue(value)
	if err != nil {
		return Token{}, err
	}
	// Errors name the token as the bad field: the key ID is part of it
	// here, not a field of a request.
	if ValidateKeyID(keyID) != nil {
		return Token{}, invalid("token", "key ID %s is not 1 to %d of a-z, 0-9 and '-'", quoteShort(keyID), MaxKeyIDLen)
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(sig)
	if err != nil || len(raw) != 64 {
		return Token{}, invalid("token", "signature %s is not 64 bytes in unpadded base64url", quoteShort(sig))
	}
	return Token{Scope: scope, Value: v, KeyID: keyID, Sig: string(raw)}, nil
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
