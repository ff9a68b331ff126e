// Package signing signs fencing tokens and verifies them.
//
// Under "the highest token accepted wins", a guard that believes any token
// can be locked out of its resource by one forged token of 2^63−1. fenced
// therefore signs every grant with Ed25519 over the scope and the token
// (fence.Token.SignedPayload), and guards given the service's
// public keys refuse any token whose signature does not verify, before they
// look at their high-water mark. A signature proves the token was issued by
// the service for that scope; it does not make an old token new: ordering
// is still the guard's comparison.
package signing

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/fence-dev/fence"
)

// Errors a verification returns. Both wrap fence.ErrInvalid: a guard answers
// them like any other malformed token.
var (
	// ErrUnsigned reports an unsigned token where a signed one is required.
	ErrUnsigned = fmt.Errorf("%w: the token is not signed; this resource accepts signed tokens only", fence.ErrInvalid)
	// ErrBadSignature reports a signature that does not verify, or a key
	// that is unknown or retired.
	ErrBadSignature = fmt.Errorf("%w: the token's signature does not verify", fence.ErrInvalid)
)

// PrivateKey is one signing key of the service.
type PrivateKey struct {
	ID   string
	Seed []byte // ed25519.SeedSize bytes
}

// NewKey returns a new random key. Its ID starts with now's Unix time, so
// IDs tell a key's age, and ends with random digits, so two keys made in
// the same second differ.
func NewKey(now time.Time) PrivateKey {
	seed := make([]byte, ed25519.SeedSize)
	_, _ = rand.Read(seed) // crypto/rand.Read never fails
	return PrivateKey{ID: fmt.Sprintf("k%d-%x", now.Unix(), seed[:3]), Seed: seed}
}

// Sign returns t signed with k, in the v3 form: the signature covers the
// scope and value, which name one grant since each value of a scope is
// granted once.
func (k PrivateKey) Sign(t fence.Token) fence.Token {
	t = t.Unsigned()
	t.KeyID = k.ID
	t.Sig = string(ed25519.Sign(ed25519.NewKeyFromSeed(k.Seed), t.SignedPayload()))
	return t
}

// Public returns the public half of k.
func (k PrivateKey) Public() PublicKey {
	return PublicKey{ID: k.ID, Key: ed25519.NewKeyFromSeed(k.Seed).Public().(ed25519.PublicKey)}
}

// PublicKey is a key guards verify with. A key past NotAfter verifies
// nothing: that is how a rotated-out key stops being trusted.
type PublicKey struct {
	ID       string            `json:"kid"`
	Key      ed25519.PublicKey `json:"public_key"` // base64 in JSON
	NotAfter time.Time         `json:"not_after,omitzero"`
}

// KeySet is the public keys a guard trusts. It is safe for concurrent use.
type KeySet struct {
	mu      sync.RWMutex
	keys    []PublicKey
	now     func() time.Time
	refresh func() bool // fetches the keys again; nil for a fixed set

	verified verifiedCache
}

// NewKeySet returns a key set of keys.
func NewKeySet(keys ...PublicKey) *KeySet {
	return &KeySet{keys: slices.Clone(keys), now: time.Now}
}

// Keys returns the keys in the set.
func (s *KeySet) Keys() []PublicKey {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.keys)
}

// Replace swaps in a new list of keys, as after fetching them again.
func (s *KeySet) Replace(keys []PublicKey) {
	s.mu.Lock()
	s.keys = slices.Clone(keys)
	s.mu.Unlock()
}

// Verify checks that t is signed by a key of the set that is still valid.
//
// A guard sees the same token on every write of one lease, and an Ed25519
// verification costs tens of microseconds, so Verify remembers the last
// few thousand tokens whose signatures verified (verifiedCap). It only
// skips the signature check for a token it has seen verify: same signed
// payload, key ID and signature bytes, under the same public key.
// The key is looked up on every call, so a token that verified before
// fails once its key is removed (Replace) or past NotAfter.
func (s *KeySet) Verify(t fence.Token) error {
	if !t.Signed() {
		return ErrUnsigned
	}
	k, ok := s.key(t.KeyID)
	if !ok && s.refresh != nil && s.refresh() {
		k, ok = s.key(t.KeyID)
	}
	switch {
	case !ok:
		return fmt.Errorf("%w: key %q is not one this resource trusts", ErrBadSignature, t.KeyID)
	case !k.NotAfter.IsZero() && s.now().After(k.NotAfter):
		return fmt.Errorf("%w: key %q was retired at %s", ErrBadSignature, t.KeyID, k.NotAfter.Format(time.RFC3339))
	case len(k.Key) != ed25519.PublicKeySize:
		return fmt.Errorf("%w (scope %q, token %d, key %q)", ErrBadSignature, t.Scope, t.Value, t.KeyID)
	}
	if s.verified.has(t, k.Key) {
		return nil
	}
	if !ed25519.Verify(k.Key, t.SignedPayload(), []byte(t.Sig)) {
		return fmt.Errorf("%w (scope %q, token %d, key %q)", ErrBadSignature, t.Scope, t.Value, t.KeyID)
	}
	s.verified.add(t, k.Key)
	return nil
}

// verifiedCap bounds the tokens a KeySet remembers as verified. A guard
// sees one current token per scope it serves, so a few thousand cover the
// busy scopes of most resources; a token that fell out is verified again.
const verifiedCap = 4096

// verifiedCache holds tokens whose signatures verified, in two generations:
// when the newer is full it becomes the older and the older is dropped, so
// at most verifiedCap tokens are kept and a token in use stays (a hit in
// the older generation moves it to the newer). The zero value is empty and
// ready.
type verifiedCache struct {
	mu       sync.Mutex
	cur, old map[verifiedKey]ed25519.PublicKey
}

// verifiedKey is everything a token's signature covers (its signed
// payload, which also tells a v2 token from a v3 one), plus the key ID and
// the signature itself: a token that differs in any of them, a forged
// signature included, is not the one that verified.
type verifiedKey struct {
	payload string
	keyID   string
	sig     string
}

func keyOf(t fence.Token) verifiedKey {
	return verifiedKey{payload: string(t.SignedPayload()), keyID: t.KeyID, sig: t.Sig}
}

// has reports whether t verified under pub. The public key is compared
// too: a key set replaced by one that reuses the key ID with another key
// must verify again.
func (c *verifiedCache) has(t fence.Token, pub ed25519.PublicKey) bool {
	k := keyOf(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.cur[k]; ok {
		return p.Equal(pub)
	}
	p, ok := c.old[k]
	if !ok || !p.Equal(pub) {
		return false
	}
	c.put(k, p)
	return true
}

func (c *verifiedCache) add(t fence.Token, pub ed25519.PublicKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.put(keyOf(t), pub)
}

func (c *verifiedCache) put(k verifiedKey, pub ed25519.PublicKey) {
	if len(c.cur) >= verifiedCap/2 {
		c.old, c.cur = c.cur, nil
	}
	if c.cur == nil {
		c.cur = make(map[verifiedKey]ed25519.PublicKey, verifiedCap/2)
	}
	c.cur[k] = pub
}

// len returns how many tokens c holds.
func (c *verifiedCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cur) + len(c.old)
}

func (s *KeySet) key(id string) (PublicKey, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i := slices.IndexFunc(s.keys, func(k PublicKey) bool { return k.ID == id })
	if i < 0 {
		return PublicKey{}, false
	}
	return s.keys[i], true
}

// File is the JSON form of a key set, as fenced serves it at /keys and as a
// guard may read it from disk: {"keys": [{"kid", "public_key", "not_after"}]}.
type File struct {
	Keys []PublicKey `json:"keys"`
}

// Load reads a key set from a JSON file in the form of File.
func Load(path string) (*KeySet, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// Parse reads a key set from its JSON form.
func Parse(b []byte) (*KeySet, error) {
	var f File
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("key set: %w", err)
	}
	if len(f.Keys) == 0 {
		return nil, errors.New("key set: no keys")
	}
	for _, k := range f.Keys {
		if err := fence.ValidateKeyID(k.ID); err != nil {
			return nil, fmt.Errorf("key set: %w", err)
		}
		if len(k.Key) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("key set: key %q is %d bytes, want an Ed25519 public key of %d", k.ID, len(k.Key), ed25519.PublicKeySize)
		}
	}
	return NewKeySet(f.Keys...), nil
}
