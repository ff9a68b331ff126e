package signing_test

import (
	"testing"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/signing"
)

// FuzzVerify: the only token texts that verify are the genuine tokens
// themselves, v3 and legacy v2. Any other text, however close (a changed
// digit of the value, the scope, the v2 lease ID, the key ID or the
// signature), is refused; nothing panics.
func FuzzVerify(f *testing.F) {
	seed := make([]byte, 32) // a fixed key, so the corpus stays meaningful
	key := signing.PrivateKey{ID: "k1", Seed: seed}
	set := signing.NewKeySet(key.Public())
	id, _ := fence.ParseLeaseID("0123456789abcdef0123456789abcdef")
	genuine := key.Sign(fence.Token{Scope: "orders", Value: 41})
	v2 := signing.SignV2(key, "orders", 41, id)
	f.Add(genuine.String())
	f.Add(v2.String())
	f.Add(genuine.Unsigned().String())
	f.Add("fence:v3:orders:42:k1:" + genuine.String()[len(genuine.String())-86:])
	f.Add("fence:v2:orders:42:0123456789abcdef0123456789abcdef:k1:" + v2.String()[len(v2.String())-86:])
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := fence.ParseToken(s)
		if err != nil {
			return
		}
		if set.Verify(tok) == nil && tok != genuine && tok != v2 {
			t.Fatalf("%q verifies but is not a genuine token (%q or %q)", s, genuine, v2)
		}
	})
}
