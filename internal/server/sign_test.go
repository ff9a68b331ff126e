package server

import (
	"context"
	"crypto/ed25519"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// The signer signs with curve25519-voi, or with crypto/ed25519 in FIPS
// mode, and guards verify with crypto/ed25519: both must make the
// signatures crypto/ed25519 makes, byte for byte, and verify there.
func TestSignaturesAreTheStandardLibrarys(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed := rapid.SliceOfN(rapid.Byte(), ed25519.SeedSize, ed25519.SeedSize).Draw(t, "seed")
		tok := fence.Token{
			Scope: rapid.StringMatching(`[a-z0-9/._-]{1,64}`).Draw(t, "scope"),
			Value: rapid.Uint64Range(1, fence.MaxToken).Draw(t, "value"),
		}
		msg := tok.SignedPayload()
		k := ed25519.NewKeyFromSeed(seed)
		want := ed25519.Sign(k, msg)
		for _, fips := range []bool{false, true} {
			got := signWith(seed, fips)(msg)
			if string(got) != string(want) {
				t.Fatalf("fips=%v: signature of %q differs from crypto/ed25519's:\n got %x\nwant %x", fips, msg, got, want)
			}
			if !ed25519.Verify(k.Public().(ed25519.PublicKey), msg, got) {
				t.Fatalf("fips=%v: crypto/ed25519 refuses the signature of %q", fips, msg)
			}
		}
	})
}

// TestPresignsReacquiredScopes: once a scope is granted again, the next
// token's signature is made ahead, and the grant that follows carries
// exactly it; a scope granted once is not signed ahead.
func TestPresignsReacquiredScopes(t *testing.T) {
	s := startSigner(t, "n1", 0)
	c := newClient(t, s)
	ctx := context.Background()
	cached := func(scope string, value uint64) (string, bool) {
		s.signer.mu.Lock()
		defer s.signer.mu.Unlock()
		sig, ok := s.signer.cache[fence.Token{Scope: scope, Value: value}]
		return sig, ok
	}
	var last fence.Lease
	for i := range 3 {
		if i == 2 {
			// Queued before the third grant of "lock", so done once that
			// grant's next token is signed.
			if _, err := c.Grant(ctx, "once"); err != nil {
				t.Fatal(err)
			}
		}
		l, err := c.Grant(ctx, "lock")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Release(ctx, "lock", l.ID); err != nil {
			t.Fatal(err)
		}
		last = l
	}
	// Each release closes a token, so lock's grants are 1, 3 and 5.
	waitFor(t, "the signature of lock's token 7", func() bool { _, ok := cached("lock", 7); return ok })
	if _, ok := cached("once", 3); ok {
		t.Error("a scope granted once had its next token signed ahead")
	}
	var k fsm.SigningKey
	s.node.Read(func(st *fsm.State) { k, _ = st.SignerAt(time.Now().UnixNano()) })
	want := signWith(k.Seed, false)(fence.Token{Scope: "lock", Value: 5}.SignedPayload())
	if last.Token != 5 || last.Signed.Sig != string(want) {
		t.Errorf("third grant of lock: token %d signed %x; want token 5 signed %x", last.Token, last.Signed.Sig, want)
	}
	if sig, ok := cached("lock", 5); !ok || sig != string(want) {
		t.Errorf("the signature made ahead for token 5 is %x, want %x", sig, want)
	}
}
