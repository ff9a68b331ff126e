package signing_test

import (
	"testing"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/signing"
)

// FuzzVerify: the only token text that verifies is the genuine token
// itself. Any other text, however close (a changed digit of the value, the
// scope, the lease ID, the key ID or the signature), is refused; nothing
// panics.
func FuzzVerify(f *testing.F) {
	seed := make([]byte, 32) // a fixed key, so the corpus stays meaningful
	key := signing.PrivateKey{ID: "k1", Seed: seed}
	set := signing.NewKeySet(key.Public())
	id, _ := fence.ParseLeaseID("0123456789abcdef0123456789abcdef")
	genuine := key.Sign(fence.Token{Scope: "orders", Value: 41, LeaseID: id})
	f.Add(genuine.String())
	f.Add(genuine.Unsigned().String())
	f.Add("fence:v2:orders:42:0123456789abcdef0123456789abcdef:k1:" + genuine.String()[len(genuine.String())-86:])
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := fence.ParseToken(s)
		if err != nil {
			return
		}
		if set.Verify(tok) == nil && tok != genuine {
			t.Fatalf("%q verifies but is not the genuine token %q", s, genuine)
		}
	})
}
