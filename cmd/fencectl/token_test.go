package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence"
)

// TestTokenVerify acquires from a signing fenced and checks its token with
// fencectl token verify: the token is of the v3 form, without the lease ID,
// and verify prints no lease ID; it verifies against the service's keys and
// against a saved key file; an altered, an unsigned and a malformed token
// do not; rotate-key publishes a new key that signs later, and meanwhile
// new grants carry the old key, and the old token still verifies.
func TestTokenVerify(t *testing.T) {
	s := startFenced(t, "--sign-tokens=true")
	var l leaseOutput
	s.wantJSON(t, 0, &l, "acquire", "orders", "--holder", "a")
	tok, err := fence.ParseToken(l.TokenText)
	if err != nil || !tok.Signed() || tok.Value != l.Token || !strings.HasPrefix(l.TokenText, "fence:v3:") || strings.Contains(l.TokenText, l.LeaseID) {
		t.Fatalf("token_text %q of lease %+v: %+v, %v; want a signed v3 token of this lease, without its ID", l.TokenText, l, tok, err)
	}
	var v verifyJSON
	r := s.wantJSON(t, 0, &v, "token", "verify", l.TokenText)
	if !v.Valid || v.Scope != "orders" || v.Token != l.Token || v.KeyID != tok.KeyID || strings.Contains(r.stdout, "lease") {
		t.Errorf("verify = %+v (%s)", v, r.stdout)
	}
	if r := s.want(t, 0, "token", "verify", l.TokenText, "-o", "text"); strings.Contains(r.stdout, "lease") {
		t.Errorf("verify -o text: %s", r.stdout)
	}

	keys := filepath.Join(t.TempDir(), "keys.json")
	b, err := fetchKeysFile(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(keys, b, 0o600)
	s.want(t, 0, "token", "verify", l.TokenText, "--keys", keys, "--addr", "127.0.0.1:1")

	inflated := tok
	inflated.Value = fence.MaxToken
	r = s.want(t, 1, "token", "verify", inflated.String())
	if !strings.Contains(r.stderr, "does not verify") {
		t.Errorf("an inflated token: %v", r)
	}
	r = s.want(t, 1, "token", "verify", "fence:v1:orders:9223372036854775807")
	if !strings.Contains(r.stderr, "not signed") {
		t.Errorf("an unsigned token: %v", r)
	}
	s.want(t, 2, "token", "verify", "fence:v2:orders:1")
	s.want(t, 2, "token", "verify", "fence:v3:orders:1")

	// rotate-key publishes the new key and says when it starts to sign
	// (fenced's --key-publish-delay, 5m by default, later); until then new
	// grants carry the old key, and the old token keeps verifying.
	var rot map[string]string // the API's RotateSigningKeyResponse
	s.wantJSON(t, 0, &rot, "token", "rotate-key")
	from, err := time.Parse(time.RFC3339, rot["signsFrom"])
	if rot["keyId"] == "" || rot["keyId"] == tok.KeyID || err != nil || !from.After(time.Now()) {
		t.Fatalf("rotate-key = %v (%v); want a new key ID that signs later", rot, err)
	}
	if b, err := fetchKeysFile(s.addr); err != nil || !strings.Contains(string(b), rot["keyId"]) {
		t.Fatalf("/keys after rotate-key: %s, %v; want the new key published", b, err)
	}
	if r := s.want(t, 0, "token", "rotate-key", "-o", "text"); !strings.Contains(r.stdout, "published at /keys and signs from") {
		t.Errorf("rotate-key -o text: %s", r.stdout)
	}
	s.want(t, 0, "token", "verify", l.TokenText)
	s.want(t, 0, "release", "orders", "--lease", l.LeaseID)
	var l2 leaseOutput
	s.wantJSON(t, 0, &l2, "acquire", "orders", "--holder", "b")
	if !strings.Contains(l2.TokenText, ":"+tok.KeyID+":") {
		t.Errorf("while %s waits to sign, token_text %s; want it signed by the old key %s", rot["keyId"], l2.TokenText, tok.KeyID)
	}
}

func fetchKeysFile(addr string) ([]byte, error) {
	resp, err := http.Get("http://" + addr + "/keys")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}
