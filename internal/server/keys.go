package server

import (
	"context"
	stded25519 "crypto/ed25519"
	"crypto/fips140"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/wire"
	"github.com/fence-dev/fence/signing"
)

// keysPath serves the public keys guards verify tokens with. Every node
// answers from its own replica of the keys.
const keysPath = "/keys"

// signer signs tokens with the state's current key, keeping the expanded
// private key of the last one it used and the signatures it made with it:
// a renewal answers the same token again, and Ed25519 signatures are
// deterministic, so the cache changes no answer while sparing renewals a
// fifth of the server's CPU (eda15be:BENCHMARKS.md, peers: renew).
//
// It signs with curve25519-voi, which makes the same RFC 8032 signatures as
// crypto/ed25519 in about 11 µs against 19 µs here: every grant is signed
// while its caller waits (eda15be:BENCHMARKS.md,
// "Signing with curve25519-voi").
// Guards verify with crypto/ed25519 (package signing).
type signer struct {
	mu    sync.Mutex
	id    string
	sign  func(msg []byte) []byte // with the key id
	cache map[fence.Token]string  // unsigned token with its lease ID → signature
}

// signed reports whether the signer has made t's signature with its
// current key.
func (sg *signer) signed(t fence.Token) bool {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	_, ok := sg.cache[t]
	return ok
}

// signWith returns a func that signs with the Ed25519 key of seed: through
// crypto/ed25519 when fips is set (GODEBUG=fips140=on asks for the Go
// Cryptographic Module's algorithms), else through curve25519-voi.
func signWith(seed []byte, fips bool) func(msg []byte) []byte {
	if fips {
		k := stded25519.NewKeyFromSeed(seed)
		return func(msg []byte) []byte { return stded25519.Sign(k, msg) }
	}
	k := ed25519.NewKeyFromSeed(seed)
	return func(msg []byte) []byte { return ed25519.Sign(k, msg) }
}

// maxCachedSignatures bounds the cache; when full it starts over.
const maxCachedSignatures = 1 << 16

// sign returns t signed with the key whose time to sign has come, or t
// unsigned when signing is off or no key exists yet.
func (s *Server) sign(t fence.Token) fence.Token {
	if !s.cfg.SignTokens {
		return t
	}
	var cur fsm.SigningKey
	s.node.Read(func(st *fsm.State) { cur, _ = st.SignerAt(time.Now().UnixNano()) })
	if cur.ID == "" {
		return t
	}
	sg := &s.signer
	sg.mu.Lock()
	if sg.id != cur.ID {
		sg.id, sg.sign, sg.cache = cur.ID, signWith(cur.Seed, fips140.Enabled()), nil
	}
	sign := sg.sign
	sig, ok := sg.cache[t]
	sg.mu.Unlock()
	if !ok {
		sig = string(sign(t.SignedPayload()))
		sg.mu.Lock()
		if sg.id == cur.ID {
			if sg.cache == nil || len(sg.cache) >= maxCachedSignatures {
				sg.cache = make(map[fence.Token]string)
			}
			sg.cache[t] = sig
		}
		sg.mu.Unlock()
	}
	t.KeyID, t.Sig = cur.ID, sig
	return t
}

// ensureKey gives a signing service its first key. The leader calls it on
// taking office, so the key is created once and replicated to every node.
// The first key signs at once: no guard can know any key before it.
func (s *Server) ensureKey(ctx context.Context) error {
	if !s.cfg.SignTokens {
		return nil
	}
	var have bool
	s.node.Read(func(st *fsm.State) { have = len(st.SigningKeys()) > 0 })
	if have {
		return nil
	}
	_, _, err := s.rotateKey(ctx, 0)
	return err
}

// RotateSigningKey implements fence.v1.ClusterService.RotateSigningKey. It
// runs on the leader (followers forward it).
func (c cluster) RotateSigningKey(ctx context.Context, _ *connect.Request[fencev1.RotateSigningKeyRequest]) (*connect.Response[fencev1.RotateSigningKeyResponse], error) {
	if !c.s.cfg.SignTokens {
		return nil, wire.ToConnect(fmt.Errorf("%w: this service does not sign tokens (fenced --sign-tokens=false)", fence.ErrInvalid))
	}
	if err := c.s.checkReady(); err != nil {
		return nil, wire.ToConnect(err)
	}
	id, from, err := c.s.rotateKey(ctx, c.s.cfg.KeyPublishDelay)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&fencev1.RotateSigningKeyResponse{KeyId: id, SignsFrom: timestamppb.New(from)}), nil
}

// rotateKey adds a new signing key, published at once and signing after
// delay, and returns its ID and when it starts to sign. The time to sign
// goes into the log entry, so every node, and a later leader, switches
// then. The old keys keep verifying for the grace period after that.
//
// Below log format 4 a member may run a build that would stop at the
// entry (docs/upgrade.md), so the key then signs at once, as before.
func (s *Server) rotateKey(ctx context.Context, delay time.Duration) (string, time.Time, error) {
	now := time.Now()
	k := signing.NewKey(now)
	c := fsm.Command{Op: fsm.OpAddKey, KeyID: k.ID, Seed: fmt.Sprintf("%x", k.Seed), TTL: s.cfg.KeyGrace, At: now.UnixNano()}
	var format int
	s.node.Read(func(st *fsm.State) { format = st.Format() })
	from := now
	if delay > 0 && format < fsm.KeyScheduleFormat {
		s.log.Warn("the new token-signing key signs at once, not after --key-publish-delay: a member runs an older build (log format below 4); guards refuse its tokens until they fetch the keys again",
			"key_id", k.ID, "log_format", format)
	} else if delay > 0 {
		from = now.Add(delay)
		c.ActivateAt = from.UnixNano()
	}
	r, err := s.node.Apply(ctx, c)
	if err == nil && r.Outcome == fsm.Invalid {
		err = r.Err
	}
	if err != nil {
		return "", time.Time{}, err
	}
	s.log.Info("new token-signing key", "key_id", k.ID, "signs_from", from, "old_keys_verify_for", s.cfg.KeyGrace)
	return k.ID, from, nil
}

// serveKeys answers GET /keys with the public keys in signing.File form.
// A node that is not ready answers 503 instead: cut off from the leader,
// it may lack a key the others already publish, and a guard that fetched
// from it would refuse honest tokens until its next fetch.
// signing.Fetch then moves on to the next node.
func (s *Server) serveKeys(w http.ResponseWriter, r *http.Request) {
	if ok, reason := s.readiness(); !ok {
		w.Header().Set("Cache-Control", "no-store")
		http.Error(w, reason+"; its keys may be out of date: fetch them from another node", http.StatusServiceUnavailable)
		return
	}
	var keys []fsm.SigningKey
	s.node.Read(func(st *fsm.State) { keys = st.SigningKeys() })
	f := signing.File{Keys: []signing.PublicKey{}}
	for _, k := range keys {
		pub := signing.PrivateKey{ID: k.ID, Seed: k.Seed}.Public()
		if k.RetireAt != 0 {
			pub.NotAfter = time.Unix(0, k.RetireAt).UTC()
		}
		f.Keys = append(f.Keys, pub)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(f)
}
