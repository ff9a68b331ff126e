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

// seedSize is the size of an Ed25519 private key seed.
const seedSize = 32

// SigningKey is one of the service's signing keys.
type SigningKey struct {
	ID       string `json:"id"`
	Seed     []byte `json:"seed"`
	Added    int64  `json:"added"`               // Unix nanoseconds, from the command
	RetireAt int64  `json:"retire_at,omitempty"` // Unix nanoseconds; 0 while current
}

func (s *State) addKey(c Command) Result {
	if slices.ContainsFunc(s.keys, func(k SigningKey) bool { return k.ID == c.KeyID }) {
		return Result{Outcome: Invalid, Err: &fence.InvalidError{Field: "key_id", Reason: fmt.Sprintf("key %q exists already", c.KeyID)}}
	}
	// The older keys stop signing now and stop verifying after the grace
	// period; keys retired before the command's time are dropped.
	kept := s.keys[:0]
	for _, k := range s.keys {
		if k.RetireAt == 0 {
			k.RetireAt = c.At + int64(c.TTL)
		}
		if k.RetireAt > c.At {
			kept = append(kept, k)
		}
	}
	seed, _ := hex.DecodeString(c.Seed) // Validate checked it
	s.keys = append(kept, SigningKey{ID: c.KeyID, Seed: seed, Added: c.At})
	return Result{Outcome: NoOp}
}

// CurrentKey returns the key that signs, if there is one.
func (s *State) CurrentKey() (SigningKey, bool) {
	if len(s.keys) == 0 {
		return SigningKey{}, false
	}
	k := s.keys[len(s.keys)-1]
	k.Seed = slices.Clone(k.Seed)
	return k, true
}

// SigningKeys returns the service's keys, oldest first; the last one signs.
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
	}
	return nil
}
