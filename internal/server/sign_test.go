package server

import (
	"crypto/ed25519"
	"testing"

	"pgregory.net/rapid"

	"github.com/fence-dev/fence"
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
