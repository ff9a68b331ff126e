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
