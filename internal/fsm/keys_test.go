package fsm

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence"
)

func addKey(id string, at int64, grace time.Duration) Command {
	return Command{Op: OpAddKey, KeyID: id, Seed: strings.Repeat("ab", seedSize), At: at, TTL: grace}
}

func TestSigningKeysRotate(t *testing.T) {
	s := New()
	s.Apply(addKey("k1", 100, time.Hour))
	if r := s.Apply(addKey("k2", 200, 50)); r.Outcome != NoOp {
		t.Fatalf("add k2: %v %v", r.Outcome, r.Err)
	}
	keys := s.SigningKeys()
	if len(keys) != 2 || keys[0].ID != "k1" || keys[0].RetireAt != 250 || keys[1].ID != "k2" || keys[1].RetireAt != 0 {
		t.Fatalf("after rotating: %+v; want k1 retiring at 250, then k2 current", keys)
	}
	// A rotation after k1's grace drops it.
	s.Apply(addKey("k3", 300, 50))
	keys = s.SigningKeys()
	if len(keys) != 2 || keys[0].ID != "k2" || keys[1].ID != "k3" {
		t.Fatalf("after the second rotation: %+v; want k2 then k3", keys)
	}
	back, err := Restore(s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if string(back.Snapshot()) != string(s.Snapshot()) {
		t.Fatal("keys do not survive a snapshot")
	}
	keys[0].Seed[0] ^= 1
	if s.SigningKeys()[0].Seed[0] == keys[0].Seed[0] {
		t.Fatal("SigningKeys shares its seeds with the state")
	}
}

func TestAddKeyRefusesBadInput(t *testing.T) {
	for _, c := range []Command{
		{Op: OpAddKey, KeyID: "K1", Seed: strings.Repeat("ab", seedSize), At: 1},
		{Op: OpAddKey, KeyID: "k1", Seed: "ab", At: 1},
		{Op: OpAddKey, KeyID: "k1", Seed: strings.Repeat("zz", seedSize), At: 1},
		{Op: OpAddKey, KeyID: "k1", Seed: strings.Repeat("ab", seedSize)},
		{Op: OpAddKey, KeyID: "k1", Seed: strings.Repeat("ab", seedSize), At: 1, TTL: -1},
	} {
		s := New()
		if r := s.Apply(c); r.Outcome != Invalid || !errors.Is(r.Err, fence.ErrInvalid) || len(s.SigningKeys()) != 0 {
			t.Errorf("%+v = %v %v, want invalid and no key", c, r.Outcome, r.Err)
		}
	}
	s := New()
	s.Apply(addKey("k1", 1, 0))
	if r := s.Apply(addKey("k1", 2, 0)); r.Outcome != Invalid {
		t.Errorf("adding k1 twice = %v", r.Outcome)
	}
}

// TestKeyScheduleSignsAfterPublish: from log format 4 on a rotated-in key
// is published at once but signs only from its ActivateAt; the key before
// it signs until then and verifies for the grace period after it. A
// rotation while a key waits retires the waiting one likewise. The
// schedule survives a snapshot, so a node restored from one, or a new
// leader, switches at the same time.
func TestKeyScheduleSignsAfterPublish(t *testing.T) {
	s := formatted(KeyScheduleFormat)
	s.Apply(addKey("k1", 100, time.Hour)) // the first key signs at once
	if k, ok := s.SignerAt(100); !ok || k.ID != "k1" {
		t.Fatalf("first key: signer %+v %v, want k1", k, ok)
	}
	next := addKey("k2", 200, 50)
	next.ActivateAt = 300
	if r := s.Apply(next); r.Outcome != NoOp {
		t.Fatalf("add k2 to sign at 300: %v %v", r.Outcome, r.Err)
	}
	keys := s.SigningKeys()
	if len(keys) != 2 || keys[1].ID != "k2" || keys[1].ActivateAt != 300 || keys[0].RetireAt != 350 {
		t.Fatalf("keys after the rotation: %+v; want k1 retiring at 350 (activation + grace), k2 published", keys)
	}
	for _, tc := range []struct {
		now  int64
		want string
	}{{200, "k1"}, {299, "k1"}, {300, "k2"}, {1000, "k2"}, {50, "k1"}} {
		if k, _ := s.SignerAt(tc.now); k.ID != tc.want {
			t.Errorf("signer at %d: %s, want %s", tc.now, k.ID, tc.want)
		}
	}

	// Rotating again while k2 waits: k2 signs, if at all, until k3 starts.
	again := addKey("k3", 250, 50)
	again.ActivateAt = 400
	s.Apply(again)
	back, err := Restore(s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if string(back.Snapshot()) != string(s.Snapshot()) {
		t.Fatal("the key schedule does not survive a snapshot")
	}
	for _, tc := range []struct {
		now  int64
		want string
	}{{299, "k1"}, {300, "k2"}, {399, "k2"}, {400, "k3"}} {
		for name, st := range map[string]*State{"state": s, "restored": back} {
			if k, _ := st.SignerAt(tc.now); k.ID != tc.want {
				t.Errorf("%s: signer at %d: %s, want %s", name, tc.now, k.ID, tc.want)
			}
		}
	}
	if keys := s.SigningKeys(); keys[1].RetireAt != 450 || keys[2].RetireAt != 0 {
		t.Errorf("after the second rotation: %+v; want k2 retiring at 450, k3 newest", keys)
	}
}

// TestKeyScheduleNeedsItsFormat: below log format 4 a key that signs later
// is refused (builds before it stop at the field) and a rotation signs at
// once, as before; snapshots of those formats never name activate_at.
func TestKeyScheduleNeedsItsFormat(t *testing.T) {
	for f := 1; f < KeyScheduleFormat; f++ {
		s := formatted(f)
		s.Apply(addKey("k1", 100, time.Hour))
		next := addKey("k2", 200, time.Hour)
		next.ActivateAt = 300
		if r := s.Apply(next); r.Outcome != Invalid || !strings.Contains(r.Err.Error(), "activate_at") {
			t.Errorf("format %d: a key that signs later = %v %v, want invalid activate_at", f, r.Outcome, r.Err)
		}
		s.Apply(addKey("k2", 200, time.Hour))
		if k, _ := s.SignerAt(0); k.ID != "k2" {
			t.Errorf("format %d: signer %s after a rotation, want k2 at once whatever the clock", f, k.ID)
		}
		if strings.Contains(string(s.Snapshot()), "activate_at") {
			t.Errorf("format %d: the snapshot names activate_at, which older builds refuse", f)
		}
	}
	for _, at := range []int64{99, 100 + int64(MaxKeyDelay) + 1} {
		c := addKey("k1", 100, time.Hour)
		c.ActivateAt = at
		if r := formatted(KeyScheduleFormat).Apply(c); r.Outcome != Invalid {
			t.Errorf("a key added at 100 that signs from %d: %v, want invalid", at, r.Outcome)
		}
	}
}
