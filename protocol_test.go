package fence_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/signing"
)

// vectors is testdata/protocol/vectors.json: the guard protocol's test
// vectors (docs/protocol.md), which every implementation in the repository
// checks.
type vectors struct {
	Keys  signing.File      `json:"keys"`
	Seeds map[string]string `json:"seeds"`
	Parse struct {
		Valid []struct {
			Text, Scope, Value, Note string
			LeaseID                  string `json:"lease_id"` // v2 only
			KeyID                    string `json:"key_id"`
			Signature                string
			PayloadHex               string `json:"payload_hex"` // v3 only
		}
		Invalid []struct{ Text, Why string }
	}
	Compare []struct {
		Presented, Highest string
		PresentedSeq       uint64 `json:"presented_sequence"`
		HighestSeq         uint64 `json:"highest_sequence"`
		Accepted           bool
		AcceptedStrict     *bool `json:"accepted_strict"`
		Why                string
	}
	Verify []struct {
		Text  string
		Valid bool
		Why   string
	}
}

func loadVectors(t *testing.T) vectors {
	t.Helper()
	b, err := os.ReadFile("testdata/protocol/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Parse.Valid) == 0 || len(v.Parse.Invalid) == 0 || len(v.Compare) == 0 || len(v.Verify) == 0 {
		t.Fatal("vectors.json has an empty section")
	}
	return v
}

// value reads a vector's decimal string exactly, as a 64-bit integer.
func value(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("vector value %q: %v", s, err)
	}
	return v
}

func TestProtocolVectorsParse(t *testing.T) {
	v := loadVectors(t)
	for _, c := range v.Parse.Valid {
		tok, err := fence.ParseToken(c.Text)
		if err != nil {
			t.Errorf("%.60s: %v, want valid", c.Text, err)
			continue
		}
		if tok.Scope != c.Scope || tok.Value != value(t, c.Value) {
			t.Errorf("%.60s: scope %q value %d, want %q %s", c.Text, tok.Scope, tok.Value, c.Scope, c.Value)
		}
		if c.Signature != "" {
			sig, _ := base64.RawURLEncoding.DecodeString(c.Signature)
			if tok.KeyID != c.KeyID || tok.Sig != string(sig) {
				t.Errorf("%.60s: key %s, want %s and the signature", c.Text, tok.KeyID, c.KeyID)
			}
			if c.PayloadHex != "" && hex.EncodeToString(tok.SignedPayload()) != c.PayloadHex {
				t.Errorf("%.60s: signed payload %q, want the bytes of %s", c.Text, tok.SignedPayload(), c.PayloadHex)
			}
		} else if tok.Signed() {
			t.Errorf("%.60s: parsed as signed", c.Text)
		}
		if tok.String() != c.Text {
			t.Errorf("%.60s: String gives %.60s; the text form must round-trip", c.Text, tok.String())
		}
	}
	for _, c := range v.Parse.Invalid {
		if tok, err := fence.ParseToken(c.Text); err == nil {
			t.Errorf("%.60s (%s): parsed as %+v, want invalid", c.Text, c.Why, tok)
		} else if !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%.60s (%s): %v does not wrap ErrInvalid", c.Text, c.Why, err)
		}
	}
}

func TestProtocolVectorsCompare(t *testing.T) {
	for _, c := range loadVectors(t).Compare {
		w := guard.Write{Token: fence.Token{Scope: "s", Value: value(t, c.Presented)}, Seq: c.PresentedSeq}
		h := guard.Mark{Token: value(t, c.Highest), Seq: c.HighestSeq}
		strict := c.Accepted
		if c.AcceptedStrict != nil {
			strict = *c.AcceptedStrict
		}
		if got := guard.Check("s", h, w, false) == nil; got != c.Accepted {
			t.Errorf("%s.%d over %s.%d (%s): accepted %v, want %v", c.Presented, c.PresentedSeq, c.Highest, c.HighestSeq, c.Why, got, c.Accepted)
		}
		if got := guard.Check("s", h, w, true) == nil; got != strict {
			t.Errorf("%s.%d over %s.%d (%s), strict: accepted %v, want %v", c.Presented, c.PresentedSeq, c.Highest, c.HighestSeq, c.Why, got, strict)
		}
	}
}

func TestProtocolVectorsVerify(t *testing.T) {
	v := loadVectors(t)
	keys := signing.NewKeySet(v.Keys.Keys...)
	for _, c := range v.Verify {
		tok, err := fence.ParseToken(c.Text)
		if err == nil {
			err = keys.Verify(tok)
		}
		if (err == nil) != c.Valid {
			t.Errorf("%.70s (%s): verify gave %v, want valid %v", c.Text, c.Why, err, c.Valid)
		}
	}
	// The seeds make the public keys and the valid signatures: Ed25519 is
	// deterministic, so the vectors can be made again from them.
	for _, k := range v.Keys.Keys {
		seed, err := hex.DecodeString(v.Seeds[k.ID])
		if err != nil {
			t.Fatalf("seed of %s: %v", k.ID, err)
		}
		priv := signing.PrivateKey{ID: k.ID, Seed: seed}
		if !priv.Public().Key.Equal(k.Key) {
			t.Errorf("seed of %s does not give its public key", k.ID)
		}
		for _, c := range v.Parse.Valid {
			tok, _ := fence.ParseToken(c.Text)
			if tok.KeyID != k.ID {
				continue
			}
			// Sign makes v3 only; the v2 vectors are signed over their
			// payload directly.
			sig := string(ed25519.Sign(ed25519.NewKeyFromSeed(seed), tok.SignedPayload()))
			if strings.HasPrefix(c.Text, "fence:v3:") && priv.Sign(tok).Sig != sig {
				t.Errorf("%.60s: Sign does not sign the v3 payload", c.Text)
			}
			if sig != tok.Sig {
				t.Errorf("%.60s: signing it again with %s's seed gives another signature", c.Text, k.ID)
			}
		}
	}
}
