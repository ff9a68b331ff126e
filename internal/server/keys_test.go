package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/testcerts"
	"github.com/fence-dev/fence/signing"
)

// startSigner starts a signing node whose rotated-in keys are published
// for delay before they sign, and waits until it is ready under log format
// 4, where a key can wait to sign. With join it joins that node's cluster.
func startSigner(t *testing.T, id string, delay time.Duration, join ...string) *Server {
	t.Helper()
	s := startClusterNode(t, id, join, func(cfg *Config) { cfg.KeyPublishDelay = delay })
	waitFor(t, id+" applies log format 4", func() bool {
		return s.node.Format() >= fsm.KeyScheduleFormat && (len(join) > 0 || s.Ready())
	})
	return s
}

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
	}
}

func newClient(t *testing.T, s *Server) *client.Client {
	t.Helper()
	c, err := client.New(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// signerAt returns the ID of the key s's replica signs with at now.
func signerAt(s *Server, now time.Time) string {
	var k fsm.SigningKey
	s.node.Read(func(st *fsm.State) { k, _ = st.SignerAt(now.UnixNano()) })
	return k.ID
}

// TestRotatedKeyWaitsToSign: a rotation publishes the new key at /keys at
// once and answers when it starts to sign; until then every grant and
// renewal is signed with the old key, which a guard that fetched the keys
// before the rotation verifies.
func TestRotatedKeyWaitsToSign(t *testing.T) {
	ctx := context.Background()
	s := startSigner(t, "n1", time.Hour)
	c := newClient(t, s)
	before, err := c.Grant(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	old := before.FencingToken().KeyID
	keys, err := signing.Refreshing(ctx, nil, s.Addr(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	rot, err := c.RotateSigningKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rot.KeyID == old || !rot.SignsFrom.After(time.Now().Add(30*time.Minute)) {
		t.Fatalf("rotation = %+v; want a new key that signs an hour from now (old key %s)", rot, old)
	}
	published, err := signing.Fetch(ctx, nil, s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(published.Keys(), func(k signing.PublicKey) bool { return k.ID == rot.KeyID }) {
		t.Fatalf("/keys after the rotation: %+v; want %s published", published.Keys(), rot.KeyID)
	}
	l, err := c.Grant(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := c.Renew(ctx, "orders", before.ID)
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]fence.Token{"grant": l.FencingToken(), "renewal": renewed.FencingToken()} {
		if tok.KeyID != old || keys.Verify(tok) != nil {
			t.Errorf("%s during the publish window: signed by %s (verify: %v); want the old key %s", name, tok.KeyID, keys.Verify(tok), old)
		}
	}
	// The schedule is the state's: the new key signs from the answer's time.
	if got := signerAt(s, rot.SignsFrom.Add(-time.Nanosecond)); got != old {
		t.Errorf("signer just before %v: %s, want %s", rot.SignsFrom, got, old)
	}
	if got := signerAt(s, rot.SignsFrom); got != rot.KeyID {
		t.Errorf("signer at %v: %s, want %s", rot.SignsFrom, got, rot.KeyID)
	}
}

// TestMadeUpKeyIDDoesNotLockOutANewKey is the attack of security issue 4:
// a token with a made-up key ID makes the guard spend its fetch, then the
// service rotates, and the first honest token of the new key must verify
// at once. The publish delay (1s) is above the guard's interval (500ms),
// as the docs ask: when the new key signs, the guard's last fetch was
// before the rotation, so more than an interval ago, and it may fetch
// again. Before two-phase rotation the new key signed at once and the
// guard refused it until its interval ran out.
func TestMadeUpKeyIDDoesNotLockOutANewKey(t *testing.T) {
	ctx := context.Background()
	const delay, interval = time.Second, 500 * time.Millisecond
	s := startSigner(t, "n1", delay)
	c := newClient(t, s)
	keys, err := signing.Refreshing(ctx, nil, s.Addr(), interval)
	if err != nil {
		t.Fatal(err)
	}
	forged := signing.NewKey(time.Now()).Sign(fence.Token{Scope: "orders", Value: fence.MaxToken})
	if err := keys.Verify(forged); !errors.Is(err, signing.ErrBadSignature) {
		t.Fatalf("a token of a made-up key ID: %v, want refused", err)
	}

	rot, err := c.RotateSigningKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(rot.SignsFrom)) // the publish window: guards fetch the key meanwhile
	l, err := c.Grant(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	honest := l.FencingToken()
	if honest.KeyID != rot.KeyID {
		t.Fatalf("a grant after %v is signed by %s, want the new key %s", rot.SignsFrom, honest.KeyID, rot.KeyID)
	}
	if err := keys.Verify(honest); err != nil {
		t.Fatalf("the first token of the new key, after a made-up key ID spent the guard's fetch: %v", err)
	}
}

// TestEveryNodeSignsWithTheNewKey: in a cluster of three, the rotation's
// schedule reaches every replica, so each signs with the old key before
// the answer's time and with the new one from then on, whichever of them
// leads then. (Stopping the leader in-process leaks Raft transport
// goroutines, so the change of leader is left to the replicas' schedule,
// checked here, and to fsm's TestKeyScheduleSignsAfterPublish.)
func TestEveryNodeSignsWithTheNewKey(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster of three")
	}
	ctx := context.Background()
	const delay = 500 * time.Millisecond
	n1 := startSigner(t, "n1", delay)
	nodes := []*Server{n1, startSigner(t, "n2", delay, n1.Addr()), startSigner(t, "n3", delay, n1.Addr())}
	c := newClient(t, n1)
	old := signerAt(n1, time.Now())
	rot, err := c.RotateSigningKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		waitFor(t, n.cfg.NodeID+" applies the rotation", func() bool {
			var keys []fsm.SigningKey
			n.node.Read(func(st *fsm.State) { keys = st.SigningKeys() })
			return slices.ContainsFunc(keys, func(k fsm.SigningKey) bool { return k.ID == rot.KeyID })
		})
		if got := signerAt(n, rot.SignsFrom.Add(-time.Nanosecond)); got != old {
			t.Errorf("%s: signer before the new key's time: %s, want %s", n.cfg.NodeID, got, old)
		}
	}
	time.Sleep(time.Until(rot.SignsFrom))
	for _, n := range nodes {
		if tok := n.sign(fence.Token{Scope: "orders", Value: 7}); tok.KeyID != rot.KeyID {
			t.Errorf("%s signs with %s after %v, want %s", n.cfg.NodeID, tok.KeyID, rot.SignsFrom, rot.KeyID)
		}
	}
}

// TestFetchKeysOverTLS fetches the keys of a fenced that serves TLS: an
// https:// URL with a client that trusts the service's CA works; a bare
// address or an http:// URL is answered by the TLS server with an error
// that says to use https and the CA; an https:// URL without the CA says
// the certificate is not trusted.
func TestFetchKeysOverTLS(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "fence test CA")
	certFile, keyFile := testcerts.Write(t, dir, "n1", ca.Issue(t, "n1"))
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Listen = t.TempDir(), "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.TLS = TLS{Cert: certFile, Key: keyFile}
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	waitFor(t, "n1 leads", s.Ready)

	// As the README shows it: the CA's PEM file in a pool of roots.
	pem, err := os.ReadFile(ca.WriteCA(t, dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	trusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer trusting.CloseIdleConnections()
	keys, err := signing.Fetch(ctx, trusting, "https://"+s.Addr())
	if err != nil || len(keys.Keys()) == 0 {
		t.Fatalf("fetch over TLS with the CA: %v", err)
	}
	refreshing, err := signing.Refreshing(ctx, trusting, "https://"+s.Addr(), time.Minute)
	if err != nil || len(refreshing.Keys()) == 0 {
		t.Fatalf("Refreshing over TLS with the CA: %v", err)
	}
	for _, tc := range []struct{ addr, want string }{
		{s.Addr(), "the server speaks TLS: use https://" + s.Addr()},
		{"http://" + s.Addr(), "the server speaks TLS: use https://" + s.Addr()},
		{"https://" + s.Addr(), "the server's certificate is not trusted"},
	} {
		if _, err := signing.Fetch(ctx, nil, tc.addr); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Fetch(%q) without the CA: %v; want an error saying %q", tc.addr, err, tc.want)
		}
	}
}

// TestKeysOnlyFromAReadyNode: a node that knows no leader may lack keys the
// cluster publishes, so it answers /keys 503, saying why, and Fetch takes
// the keys from the next node of its list.
func TestKeysOnlyFromAReadyNode(t *testing.T) {
	ready := startSigner(t, "n1", 0)
	cfg := DefaultConfig()
	// A node of a cluster that never formed: it elects no one and learns
	// no key.
	cfg.NodeID, cfg.DataDir, cfg.Listen, cfg.RaftListen = "lone", t.TempDir(), "127.0.0.1:0", "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	lone, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		lone.Close(ctx)
	})
	resp, err := http.Get("http://" + lone.Addr() + "/keys")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "no leader known") {
		t.Fatalf("/keys of a node without a leader: %s %q, want 503 saying why", resp.Status, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := signing.Fetch(ctx, nil, lone.Addr()); err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "no leader known") {
		t.Fatalf("Fetch from the lone node: %v, want its 503 and reason", err)
	}
	set, err := signing.Fetch(ctx, nil, lone.Addr()+","+ready.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if want := signerAt(ready, time.Now()); !slices.ContainsFunc(set.Keys(), func(k signing.PublicKey) bool { return k.ID == want }) {
		t.Fatalf("Fetch of lone,ready: keys %v, want the ready node's %s", set.Keys(), want)
	}
}
