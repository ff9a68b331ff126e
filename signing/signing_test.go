package signing_test

import (
	"encoding/json"
	"errors"
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
	id := fence.NewLeaseID()
	good := k.Sign(fence.Token{Scope: "orders", Value: 41, LeaseID: id})
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
	otherLease := good
	otherLease.LeaseID = fence.NewLeaseID()
	wrongKID := good
	wrongKID.KeyID = "k-unknown"
	flipped := good
	b := []byte(flipped.Sig)
	b[0] ^= 1
	flipped.Sig = string(b)
	for name, tok := range map[string]fence.Token{
		"inflated value":        inflated,
		"another scope":         foreign,
		"another lease ID":      otherLease,
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

func TestRetiredKeyVerifiesNothing(t *testing.T) {
	k := signing.NewKey(time.Now())
	pub := k.Public()
	pub.NotAfter = time.Now().Add(-time.Second)
	tok := k.Sign(fence.Token{Scope: "a", Value: 1, LeaseID: fence.NewLeaseID()})
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
	if err := set.Verify(k.Sign(fence.Token{Scope: "a", Value: 1, LeaseID: fence.NewLeaseID()})); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{``, `{}`, `{"keys":[]}`, `{"keys":[{"kid":"K!","public_key":"AAAA"}]}`, `{"keys":[{"kid":"k1","public_key":"AAAA"}]}`} {
		if _, err := signing.Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%s) accepted it", bad)
		}
	}
}
