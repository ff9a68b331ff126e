package fsm

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fence-dev/fence"
)

// model is the simplest thing that behaves like a State: per scope, the
// last token, the holder and the queue.
type model struct {
	scopes map[string]*modelScope
}

type modelScope struct {
	last    uint64
	holder  fence.LeaseID // zero when free
	token   uint64
	queue   []fence.LeaseID
	granted map[fence.LeaseID]uint64 // every lease ID ever granted, with its token
}

func (m *model) scope(name string) *modelScope {
	if m.scopes[name] == nil {
		m.scopes[name] = &modelScope{granted: map[fence.LeaseID]uint64{}}
	}
	return m.scopes[name]
}

func (ms *modelScope) grant(id fence.LeaseID) uint64 {
	ms.last++
	ms.holder, ms.token = id, ms.last
	ms.granted[id] = ms.last
	return ms.last
}

func (ms *modelScope) free() (next uint64) {
	ms.holder, ms.token = fence.LeaseID{}, 0
	if len(ms.queue) > 0 {
		id := ms.queue[0]
		ms.queue = ms.queue[1:]
		return ms.grant(id)
	}
	return 0
}

// TestPropertyAgainstModel applies random command sequences (without
// request IDs, which the model leaves out) to a State and to the model and
// checks, at every step, that they agree and that invariants 1-3 hold:
// tokens of successive grants strictly increase and never repeat; checking
// (renewing) the current lease never changes its token; release succeeds
// only for the current lease ID.
func TestPropertyAgainstModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := New()
		m := &model{scopes: map[string]*modelScope{}}
		scopes := []string{"a", "b", "c/d"}
		var ids []fence.LeaseID
		newID := func() fence.LeaseID {
			id := fence.LeaseID{0: 1, 8: byte(len(ids)), 9: byte(len(ids) >> 8)}
			ids = append(ids, id)
			return id
		}
		anyID := func(t *rapid.T) fence.LeaseID {
			if len(ids) == 0 || rapid.Bool().Draw(t, "fresh") {
				return newID()
			}
			return rapid.SampledFrom(ids).Draw(t, "id")
		}
		lastGranted := map[string]uint64{}
		seen := map[string]map[uint64]bool{}

		for step := range rapid.IntRange(1, 200).Draw(t, "steps") {
			name := rapid.SampledFrom(scopes).Draw(t, "scope")
			ms := m.scope(name)
			var c Command
			var wantOutcome Outcome
			var wantGrant uint64 // token the command must grant, 0 for none
			switch op := rapid.IntRange(0, 5).Draw(t, "op"); op {
			case 0, 1: // acquire
				c = Command{Op: OpAcquire, Scope: name, LeaseID: newID(), TTL: time.Second, Wait: op == 1}
				switch {
				case ms.holder.IsZero():
					wantOutcome, wantGrant = Granted, ms.grant(c.LeaseID)
				case c.Wait:
					wantOutcome = Queued
					ms.queue = append(ms.queue, c.LeaseID)
				default:
					wantOutcome = Held
				}
			case 2: // release
				id := anyID(t)
				if !ms.holder.IsZero() && rapid.Bool().Draw(t, "current") {
					id = ms.holder
				}
				c = Command{Op: OpRelease, Scope: name, LeaseID: id}
				if id == ms.holder && !id.IsZero() {
					wantOutcome = Released
					wantGrant = ms.free()
				} else if _, ok := ms.granted[id]; ok {
					wantOutcome = Lost // approximately: only the last few grants are remembered
				} else {
					wantOutcome = NotHolder
				}
			case 3: // expire, with the current or another token
				tok := ms.token
				if tok == 0 || rapid.Bool().Draw(t, "stale") {
					tok = rapid.Uint64Range(1, ms.last+1).Draw(t, "token")
				}
				c = Command{Op: OpExpire, Scope: name, Token: tok}
				if tok == ms.token && tok != 0 {
					wantOutcome = Expired
					wantGrant = ms.free()
				} else {
					wantOutcome = NoOp
				}
			case 4: // cancel a waiter (or whatever ID)
				id := anyID(t)
				if len(ms.queue) > 0 && rapid.Bool().Draw(t, "queued") {
					id = rapid.SampledFrom(ms.queue).Draw(t, "waiter")
				}
				c = Command{Op: OpCancel, Scope: name, LeaseID: id}
				switch i := slices.Index(ms.queue, id); {
				case i >= 0:
					wantOutcome = Cancelled
					ms.queue = slices.Delete(ms.queue, i, i+1)
				case id == ms.holder && !id.IsZero():
					wantOutcome = Released
					wantGrant = ms.free()
				default:
					wantOutcome = NoOp
				}
			case 5: // promote
				c = Command{Op: OpPromote}
				wantOutcome = NoOp
				for _, other := range m.scopes {
					other.queue = nil
				}
			}

			r := s.Apply(c)
			if wantOutcome == Lost && r.Outcome == NotHolder {
				wantOutcome = NotHolder // the grant fell out of the remembered window
			}
			if r.Outcome != wantOutcome {
				t.Fatalf("step %d: %+v: outcome %v, want %v", step, c, r.Outcome, wantOutcome)
			}
			for _, e := range r.Events {
				if e.Kind != EventGranted {
					continue
				}
				// Invariant 1: strictly increasing, never repeated.
				if e.Lease.Token <= lastGranted[e.Scope] {
					t.Fatalf("step %d: %s granted token %d after %d", step, e.Scope, e.Lease.Token, lastGranted[e.Scope])
				}
				if seen[e.Scope] == nil {
					seen[e.Scope] = map[uint64]bool{}
				}
				if seen[e.Scope][e.Lease.Token] {
					t.Fatalf("step %d: %s token %d issued twice", step, e.Scope, e.Lease.Token)
				}
				seen[e.Scope][e.Lease.Token] = true
				lastGranted[e.Scope] = e.Lease.Token
				if e.Scope == name && wantGrant != e.Lease.Token {
					t.Fatalf("step %d: granted token %d, model says %d", step, e.Lease.Token, wantGrant)
				}
			}
			compare(t, step, s, m)
			if rapid.IntRange(0, 20).Draw(t, "snapshot") == 0 {
				roundTrip(t, s)
			}
		}
	})
}

// compare checks the State against the model, and that Check of the
// current lease gives its token (invariant 2) and of any other ID does not
// succeed (invariant 3).
func compare(t *rapid.T, step int, s *State, m *model) {
	for name, ms := range m.scopes {
		in := s.Get(name)
		if in.Last != ms.last || in.Waiters != len(ms.queue) {
			t.Fatalf("step %d: %s = last %d waiters %d, model %d %d", step, name, in.Last, in.Waiters, ms.last, len(ms.queue))
		}
		if ms.holder.IsZero() != (in.Lease == nil) {
			t.Fatalf("step %d: %s held %v, model %v", step, name, in.Lease != nil, !ms.holder.IsZero())
		}
		if in.Lease == nil {
			if in.Waiters != 0 {
				t.Fatalf("step %d: %s has waiters but no holder", step, name)
			}
			continue
		}
		if in.Lease.ID != ms.holder || in.Lease.Token != ms.token {
			t.Fatalf("step %d: %s holder %s/%d, model %s/%d", step, name, in.Lease.ID, in.Lease.Token, ms.holder, ms.token)
		}
		if r := s.Check(name, ms.holder); r.Outcome != Granted || r.Lease.Token != ms.token {
			t.Fatalf("step %d: check of the current lease = %v token %d, want token %d", step, r.Outcome, r.Lease.Token, ms.token)
		}
		for id := range ms.granted {
			if id != ms.holder && s.Check(name, id).Outcome == Granted {
				t.Fatalf("step %d: %s: check of old lease %s succeeded", step, name, id)
			}
		}
	}
}

// roundTrip checks that a snapshot restores to a state with the same
// snapshot bytes, and that both continue alike.
func roundTrip(t *rapid.T, s *State) {
	snap := s.Snapshot()
	r, err := Restore(snap)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if !bytes.Equal(r.Snapshot(), snap) {
		t.Fatalf("snapshot round trip changed the bytes")
	}
	probe := Command{Op: OpAcquire, Scope: "a", LeaseID: fence.LeaseID{0: 2}, TTL: time.Second}
	a, b := s.Snapshot(), r.Snapshot()
	ra, rb := cloneOf(t, a).Apply(probe), cloneOf(t, b).Apply(probe)
	if fmt.Sprint(ra.Outcome, ra.Lease.Token) != fmt.Sprint(rb.Outcome, rb.Lease.Token) {
		t.Fatalf("restored state continues differently: %v/%d vs %v/%d", ra.Outcome, ra.Lease.Token, rb.Outcome, rb.Lease.Token)
	}
}

func cloneOf(t *rapid.T, snap []byte) *State {
	s, err := Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
