package fsm

import (
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	"github.com/fence-dev/fence"
)

// The service's token-signing keys are replicated with the state, so every
// node signs with the same key and guards need one key set for a cluster.
// The private halves live where the log and snapshots live: in each node's
// data directory.
//
// From log format 4 on a rotation has two phases. OpAddKey adds the key
// with the time it starts to sign (ActivateAt); until then it is only
// published at /keys, so that guards, which fetch the keys at most once per
// interval, know it before the first token carries it: a guard that spent
// its fetch on a token of a made-up key ID before the rotation may fetch
// again by the time the new key signs. Which key signs at a given time is
// the newest whose ActivateAt has passed (SignerAt): the schedule is in the
// state, so every node agrees on it, and a new leader keeps it.

// seedSize is the size of an Ed25519 private key seed.
const seedSize = 32

// SigningKey is one of the service's signing keys.
type SigningKey struct {
	ID       string `json:"id"`
	Seed     []byte `json:"seed"`
	Added    int64  `json:"added"`               // Unix nanoseconds, from the command
	RetireAt int64  `json:"retire_at,omitempty"` // Unix nanoseconds; 0 for the newest key
	// ActivateAt is when the key starts to sign, Unix nanoseconds; 0 for
	// a key that signs from the entry that added it, whatever a node's
	// clock says (every key before log format 4, and a service's first
	// key).
	ActivateAt int64 `json:"activate_at,omitempty"`
}

func (s *State) addKey(c Command) Result {
	if slices.ContainsFunc(s.keys, func(k SigningKey) bool { return k.ID == c.KeyID }) {
		return Result{Outcome: Invalid, Err: &fence.InvalidError{Field: "key_id", Reason: fmt.Sprintf("key %q exists already", c.KeyID)}}
	}
	if c.ActivateAt != 0 && s.Format() < KeyScheduleFormat {
		// A build before the format stopped at this entry; the leader
		// writes none below it.
		return Result{Outcome: Invalid, Err: &fence.InvalidError{Field: "activate_at",
			Reason: fmt.Sprintf("a key that signs later, under log format %d; from %d on", s.Format(), KeyScheduleFormat)}}
	}
	// The older keys stop signing when the new one starts and stop
	// verifying a grace period later; keys retired before the command's
	// time are dropped. A key added while another still waits to sign
	// retires that one likewise: it signs, if at all, until the new one
	// starts.
	start := max(c.ActivateAt, c.At)
	kept := s.keys[:0]
	for _, k := range s.keys {
		if k.RetireAt == 0 {
			k.RetireAt = start + int64(c.TTL)
		}
		if k.RetireAt > c.At {
			kept = append(kept, k)
		}
	}
	seed, _ := hex.DecodeString(c.Seed) // Validate checked it
	s.keys = append(kept, SigningKey{ID: c.KeyID, Seed: seed, Added: c.At, ActivateAt: c.ActivateAt})
	return Result{Outcome: NoOp}
}

// SignerAt returns the key that signs at now (Unix nanoseconds): the
// newest key whose time to sign has come. If none has come (a clock far
// behind the proposer's), the oldest key signs: a service with keys always
// signs.
func (s *State) SignerAt(now int64) (SigningKey, bool) {
	if len(s.keys) == 0 {
		return SigningKey{}, false
	}
	i := len(s.keys) - 1
	for i > 0 && s.keys[i].ActivateAt > now {
		i--
	}
	k := s.keys[i]
	k.Seed = slices.Clone(k.Seed)
	return k, true
}

// SigningKeys returns the service's keys, oldest first: those that
// verify, and the newest, which signs from its ActivateAt on.
func (s *State) SigningKeys() []SigningKey {
	out := slices.Clone(s.keys)
	for i := range out {
		out[i].Seed = slices.Clone(out[i].Seed)
	}
	return out
}

func validateKeyCommand(c Command) error {
	if err := fence.ValidateKeyID(c.KeyID); err != nil {
		return err
	}
	if b, err := hex.DecodeString(c.Seed); err != nil || len(b) != seedSize {
		return &fence.InvalidError{Field: "seed", Reason: fmt.Sprintf("want %d hexadecimal digits, an Ed25519 seed", 2*seedSize)}
	}
	if c.TTL < 0 || c.TTL > 366*24*time.Hour {
		return &fence.InvalidError{Field: "ttl", Reason: fmt.Sprintf("grace period %v is outside 0 to 366 days", c.TTL)}
	}
	if c.At <= 0 {
		return &fence.InvalidError{Field: "at", Reason: "a new key needs the time it was added"}
	}
	if c.ActivateAt != 0 && (c.ActivateAt < c.At || c.ActivateAt-c.At > int64(MaxKeyDelay)) {
		return &fence.InvalidError{Field: "activate_at", Reason: fmt.Sprintf("a key that starts to sign %v after it is added; want 0 to %v", time.Duration(c.ActivateAt-c.At), MaxKeyDelay)}
	}
	return nil
}

func checkKeys(keys []SigningKey) error {
	for i, k := range keys {
		if err := fence.ValidateKeyID(k.ID); err != nil {
			return err
		}
		if len(k.Seed) != seedSize {
			return fmt.Errorf("key %q: seed of %d bytes", k.ID, len(k.Seed))
		}
		if (k.RetireAt == 0) != (i == len(keys)-1) {
			return fmt.Errorf("key %q: only the last key is current", k.ID)
		}
		if k.ActivateAt != 0 && k.ActivateAt < k.Added {
			return fmt.Errorf("key %q: signs from %d, before it was added at %d", k.ID, k.ActivateAt, k.Added)
		}
	}
	return nil
}
