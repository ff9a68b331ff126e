package signing_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/signing"
)

func TestSignVerify(t *testing.T) {
	k := signing.NewKey(time.Now())
	other := signing.NewKey(time.Now())
	other.ID = "k-other"
	set := signing.NewKeySet(k.Public())
	good := k.Sign(fence.Token{Scope: "orders", Value: 41})
	if !strings.HasPrefix(good.String(), "fence:v3:orders:41:"+k.ID+":") {
		t.Fatalf("Sign made %q, want the v3 form", good)
	}
	if err := set.Verify(good); err != nil {
		t.Fatalf("a token signed by a trusted key: %v", err)
	}
	back, err := fence.ParseToken(good.String())
	if err != nil || back != good {
		t.Fatalf("ParseToken(String()) = %+v, %v; want %+v", back, err, good)
	}
	if err := set.Verify(back); err != nil {
		t.Fatalf("the parsed token: %v", err)
	}

	inflated := good
	inflated.Value = fence.MaxToken
	foreign := good
	foreign.Scope = "billing"
	wrongKID := good
	wrongKID.KeyID = "k-unknown"
	flipped := good
	b := []byte(flipped.Sig)
	b[0] ^= 1
	flipped.Sig = string(b)
	for name, tok := range map[string]fence.Token{
		"inflated value":        inflated,
		"another scope":         foreign,
		"unknown key":           wrongKID,
		"flipped bit":           flipped,
		"signed by another key": func() fence.Token { t := other.Sign(good); t.KeyID = k.ID; return t }(),
	} {
		if err := set.Verify(tok); !errors.Is(err, signing.ErrBadSignature) || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: Verify = %v, want ErrBadSignature", name, err)
		}
	}
	if err := set.Verify(good.Unsigned()); !errors.Is(err, signing.ErrUnsigned) {
		t.Errorf("unsigned: Verify = %v, want ErrUnsigned", err)
	}
}

// TestV2StillVerifies: a token of the legacy v2 form, whose text and
// signature carry the lease ID, verifies as before; the same token with
// another lease ID, or re-written as v3 with the v2 signature, does not.
func TestV2StillVerifies(t *testing.T) {
	k := signing.NewKey(time.Now())
	set := signing.NewKeySet(k.Public())
	id := fence.NewLeaseID()
	v2 := signing.SignV2(k, "orders", 41, id)
	if !strings.HasPrefix(v2.String(), "fence:v2:orders:41:"+id.String()+":") {
		t.Fatalf("SignV2 made %q, want the v2 form", v2)
	}
	if err := set.Verify(v2); err != nil {
		t.Fatalf("a v2 token signed by a trusted key: %v", err)
	}
	otherLease, err := fence.ParseToken(strings.Replace(v2.String(), id.String(), fence.NewLeaseID().String(), 1))
	if err != nil {
		t.Fatal(err)
	}
	asV3 := k.Sign(v2)
	asV3.Sig = v2.Sig
	for name, tok := range map[string]fence.Token{"another lease ID": otherLease, "v2 signature on v3": asV3} {
		if err := set.Verify(tok); !errors.Is(err, signing.ErrBadSignature) {
			t.Errorf("%s: Verify = %v, want ErrBadSignature", name, err)
		}
	}
}

func TestRetiredKeyVerifiesNothing(t *testing.T) {
	k := signing.NewKey(time.Now())
	pub := k.Public()
	pub.NotAfter = time.Now().Add(-time.Second)
	tok := k.Sign(fence.Token{Scope: "a", Value: 1})
	if err := signing.NewKeySet(pub).Verify(tok); !errors.Is(err, signing.ErrBadSignature) {
		t.Fatalf("Verify with a retired key = %v, want ErrBadSignature", err)
	}
	pub.NotAfter = time.Now().Add(time.Hour)
	if err := signing.NewKeySet(pub).Verify(tok); err != nil {
		t.Fatalf("Verify with a key in its grace period = %v", err)
	}
}

func TestParseKeySet(t *testing.T) {
	k := signing.NewKey(time.Now())
	b, err := json.Marshal(signing.File{Keys: []signing.PublicKey{k.Public()}})
	if err != nil {
		t.Fatal(err)
	}
	set, err := signing.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := set.Verify(k.Sign(fence.Token{Scope: "a", Value: 1})); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{``, `{}`, `{"keys":[]}`, `{"keys":[{"kid":"K!","public_key":"AAAA"}]}`, `{"keys":[{"kid":"k1","public_key":"AAAA"}]}`} {
		if _, err := signing.Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%s) accepted it", bad)
		}
	}
}
