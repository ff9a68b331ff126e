package fsm

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence"
)

// randomLog returns a reproducible log of commands over a few scopes.
func randomLog(seed uint64, n int) []Command {
	rng := rand.New(rand.NewPCG(seed, seed))
	var log []Command
	held := map[string][]fence.LeaseID{}
	for i := range n {
		scope := fmt.Sprintf("s/%d", rng.IntN(5))
		lid := fence.LeaseID{0: 1, 1: byte(i), 2: byte(i >> 8)}
		switch rng.IntN(4) {
		case 0, 1:
			log = append(log, Command{Op: OpAcquire, Scope: scope, LeaseID: lid, Holder: "h", TTL: time.Second,
				Wait: rng.IntN(2) == 0, RequestID: fmt.Sprint("r", rng.IntN(50)), At: int64(i)})
			held[scope] = append(held[scope], lid)
		case 2:
			if ids := held[scope]; len(ids) > 0 {
				log = append(log, Command{Op: OpRelease, Scope: scope, LeaseID: ids[rng.IntN(len(ids))], At: int64(i)})
			}
		case 3:
			log = append(log, Command{Op: OpExpire, Scope: scope, Token: uint64(rng.IntN(i + 1)), At: int64(i)})
		}
	}
	return log
}

func applyAll(s *State, log []Command) *State {
	for _, c := range log {
		s.Apply(c)
	}
	return s
}

// TestReplayIsDeterministic: the same log gives byte-identical snapshots,
// and a snapshot taken half way plus the rest of the log gives the same
// state as the whole log. This is what lets every replica, and every
// restart, agree on the counters.
func TestReplayIsDeterministic(t *testing.T) {
	for seed := range uint64(20) {
		log := randomLog(seed, 500)
		a := applyAll(New(), log).Snapshot()
		b := applyAll(New(), log).Snapshot()
		if !bytes.Equal(a, b) {
			t.Fatalf("seed %d: two replays differ", seed)
		}
		half, err := Restore(applyAll(New(), log[:250]).Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		if c := applyAll(half, log[250:]).Snapshot(); !bytes.Equal(a, c) {
			t.Fatalf("seed %d: snapshot + rest of log differs from the whole log", seed)
		}
	}
}

func TestRestoreRefusesTruncation(t *testing.T) {
	snap := applyAll(New(), randomLog(1, 200)).Snapshot()
	for n := range len(snap) {
		if _, err := Restore(snap[:n]); err == nil {
			t.Fatalf("a snapshot cut to %d of %d bytes was accepted", n, len(snap))
		}
	}
}

func TestRestoreRefusesCorruption(t *testing.T) {
	snap := applyAll(New(), randomLog(2, 100)).Snapshot()
	for i := range len(snap) {
		bad := bytes.Clone(snap)
		bad[i] ^= 0x01
		if _, err := Restore(bad); err == nil {
			t.Fatalf("a snapshot with byte %d flipped was accepted", i)
		}
	}
}

// withChecksum frames a hand-made body as a snapshot with a valid checksum,
// so only the record checks stand between it and the state.
func withChecksum(body string) []byte {
	return fmt.Appendf(nil, "%s%08x\n%s", snapshotMagic, crc32.Checksum([]byte(body), castagnoli), body)
}

func TestRestoreRefusesInconsistentRecords(t *testing.T) {
	const id = `"00000000000000000000000000000001"`
	for name, body := range map[string]string{
		"lease above counter":  `{"scopes":[{"scope":"a","last":1,"lease":{"token":2,"id":` + id + `,"ttl":1}}]}`,
		"waiters on free":      `{"scopes":[{"scope":"a","last":1,"waiters":[{"id":` + id + `,"ttl":1}]}]}`,
		"duplicate scope":      `{"scopes":[{"scope":"a","last":1},{"scope":"a","last":0}]}`,
		"bad scope":            `{"scopes":[{"scope":"../a","last":1}]}`,
		"counter above max":    `{"scopes":[{"scope":"a","last":9223372036854775808}]}`,
		"zero lease id":        `{"scopes":[{"scope":"a","last":1,"lease":{"token":1,"id":"00000000000000000000000000000000","ttl":1}}]}`,
		"unknown field":        `{"scopes":[],"x":1}`,
		"recent above counter": `{"scopes":[{"scope":"a","last":1,"recent":[{"token":5,"id":` + id + `}]}]}`,
	} {
		if _, err := Restore(withChecksum(body)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := Restore(withChecksum(`{"scopes":[{"scope":"a","last":7}]}`)); err != nil {
		t.Fatalf("a valid hand-made snapshot was refused: %v", err)
	}
	if _, err := Restore([]byte("hello\n{}")); err == nil || !strings.Contains(err.Error(), "not a fence snapshot") {
		t.Fatalf("foreign data: %v", err)
	}
}
