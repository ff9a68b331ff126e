package signing

import (
	"crypto/ed25519"
	"encoding/base64"
	"strconv"

	"github.com/fence-dev/fence"
)

// SignV2 returns a token in the legacy v2 form, which fenced issued before
// v3: its signature also covers the lease ID, which its text carries. The
// service no longer makes these; tests use it to check that tokens handed
// out before an upgrade still verify. It parses the text it builds, as a
// guard would.
func SignV2(k PrivateKey, scope string, value uint64, id fence.LeaseID) fence.Token {
	v := strconv.FormatUint(value, 10)
	payload := "fence-token-v2\x00" + scope + "\x00" + v + "\x00" + id.String()
	sig := ed25519.Sign(ed25519.NewKeyFromSeed(k.Seed), []byte(payload))
	t, err := fence.ParseToken("fence:v2:" + scope + ":" + v + ":" + id.String() + ":" + k.ID + ":" + base64.RawURLEncoding.EncodeToString(sig))
	if err != nil {
		panic(err) // the test's own inputs are wrong
	}
	return t
}
