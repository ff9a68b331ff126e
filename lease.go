package fence

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// LeaseID is the random 128-bit identity of one grant. It proves who may
// renew or release a lease; it says nothing about recency, which is what the
// token is for. The zero LeaseID is never issued.
type LeaseID [16]byte

// NewLeaseID returns a random lease ID.
func NewLeaseID() LeaseID {
	var id LeaseID
	for id.IsZero() {
		_, _ = rand.Read(id[:]) // crypto/rand.Read never fails
	}
	return id
}

// ParseLeaseID parses the 32 hexadecimal digits that LeaseID.String returns.
func ParseLeaseID(s string) (LeaseID, error) {
	var id LeaseID
	if len(s) != 2*len(id) {
		return LeaseID{}, invalid("lease_id", "%s is %d characters; want 32 hexadecimal digits", quoteShort(s), len(s))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return LeaseID{}, invalid("lease_id", "%s is not 32 hexadecimal digits", quoteShort(s))
	}
	if id.IsZero() {
		return LeaseID{}, invalid("lease_id", "the zero ID is never issued")
	}
	return id, nil
}

// String returns the ID as 32 lowercase hexadecimal digits.
func (id LeaseID) String() string { return hex.EncodeToString(id[:]) }

// Fingerprint returns a name for id that is safe to show where the ID
// itself must not go (logs, watch events, the status page): the first 8
// bytes of the SHA-256 of its 16 bytes, in 16 hexadecimal digits, or "" for the zero ID.
// It tells leases apart but reveals nothing of the ID, which renews and
// releases the lease; a prefix of the ID would reveal part of that secret.
func (id LeaseID) Fingerprint() string {
	if id.IsZero() {
		return ""
	}
	sum := sha256.Sum256(id[:])
	return hex.EncodeToString(sum[:8])
}

// IsZero reports whether id is the zero value.
func (id LeaseID) IsZero() bool { return id == LeaseID{} }

// MarshalText implements encoding.TextMarshaler.
func (id LeaseID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler. Unlike ParseLeaseID it
// accepts the zero ID, which MarshalText writes for a lease whose ID was
// not disclosed, so every Lease survives a JSON round trip.
func (id *LeaseID) UnmarshalText(b []byte) error {
	if string(b) == (LeaseID{}).String() {
		*id = LeaseID{}
		return nil
	}
	v, err := ParseLeaseID(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

// Lease describes one grant as the service reports it. It is a plain value;
// the client's live handle is client.Lease.
type Lease struct {
	Scope     string
	Token     uint64
	ID        LeaseID // zero when the service does not disclose it (get, list)
	Holder    string
	TTL       time.Duration
	ExpiresIn time.Duration // time left as the service saw it when it answered
	// Signed is the signed form of the token when the service signs grants
	// (acquire and renew answers only); the zero Token otherwise.
	Signed Token
}

// FencingToken returns the lease's token together with its scope, signed
// when the service signed it.
func (l Lease) FencingToken() Token {
	if l.Signed.Signed() {
		return l.Signed
	}
	return Token{Scope: l.Scope, Value: l.Token}
}
