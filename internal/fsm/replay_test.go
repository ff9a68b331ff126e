package fsm

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fence-dev/fence"
)

// randomLog returns a reproducible log of n commands over a few scopes that
// uses every operation. Like a leader, it looks at the state the log has
// built so far, so that releases, cancels and expiries often name the
// current lease or token, and sometimes an old or unknown one. A few
// commands are malformed.
func randomLog(seed uint64, n int) []Command {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	scopes := []string{"a", "b/1", "b/2", "c"}
	s := newReplica()
	var ids []fence.LeaseID
	pick := func(scope string) fence.LeaseID {
		if l := s.Get(scope).Lease; l != nil && rng.IntN(2) == 0 {
			return l.ID
		}
		if len(ids) == 0 || rng.IntN(8) == 0 {
			return fence.LeaseID{0: 0xee, 15: byte(rng.IntN(256))} // never issued
		}
		return ids[rng.IntN(len(ids))]
	}
	log := make([]Command, 0, n)
	for i := range n {
		scope := scopes[rng.IntN(len(scopes))]
		at := int64(i+1) * int64(time.Millisecond)
		var c Command
		if seed%2 == 1 && i == n/3 {
			// Half the logs raise the format partway, so that replicas
			// drop idle scopes and create them again.
			c = Command{Op: OpSetFormat, Format: 2}
			s.Apply(c)
			log = append(log, c)
			continue
		}
		switch k := rng.IntN(20); {
		case k < 8:
			id := fence.LeaseID{0: 0xa0, 1: byte(seed), 14: byte(i >> 8), 15: byte(i)}
			ids = append(ids, id)
			c = Command{Op: OpAcquire, Scope: scope, LeaseID: id, Holder: fmt.Sprintf("worker-%d", rng.IntN(5)),
				TTL: time.Duration(1+rng.IntN(10)) * time.Second, Wait: rng.IntN(2) == 0, At: at}
			if rng.IntN(3) > 0 {
				c.RequestID = fmt.Sprintf("req-%d", rng.IntN(12))
			}
		case k < 12:
			c = Command{Op: OpRelease, Scope: scope, LeaseID: pick(scope), At: at}
		case k < 15:
			tok := uint64(1 + rng.IntN(int(s.Get(scope).Last)+2))
			if l := s.Get(scope).Lease; l != nil && rng.IntN(3) > 0 {
				tok = l.Token
			}
			c = Command{Op: OpExpire, Scope: scope, Token: tok, At: at}
		case k < 17:
			id := pick(scope)
			if sc := s.scopes[scope]; sc != nil && len(sc.waiters()) > 0 && rng.IntN(2) == 0 {
				id = sc.waiters()[rng.IntN(len(sc.waiters()))].ID
			}
			c = Command{Op: OpCancel, Scope: scope, LeaseID: id, At: at}
		case k < 18:
			c = Command{Op: OpPromote, At: at}
		default:
			c = []Command{
				{Op: OpAcquire, Scope: scope + "//x", LeaseID: fence.LeaseID{1}, TTL: time.Second, At: at},
				{Op: OpExpire, Scope: scope, At: at},
				{Op: OpRelease, Scope: scope, At: at},
			}[rng.IntN(3)]
		}
		s.Apply(c)
		log = append(log, c)
	}
	return log
}

// newReplica returns a state that keeps a single idle record once its
// format is raised, so that a log over a few scopes drops some.
func newReplica() *State {
	s := New()
	s.keepIdle = 1
	return s
}

func applyAll(s *State, log []Command) []Result {
	out := make([]Result, len(log))
	for i, c := range log {
		out[i] = s.Apply(c)
	}
	return out
}

// TestRandomLogUsesEveryOutcome keeps randomLog honest: a replay test over
// a log that never hands off or expires would prove little.
func TestRandomLogUsesEveryOutcome(t *testing.T) {
	seen := map[Outcome]int{}
	var events int
	for seed := range uint64(10) {
		for _, r := range applyAll(newReplica(), randomLog(seed, 400)) {
			seen[r.Outcome]++
			events += len(r.Events)
		}
	}
	for o := range Outcome(len(outcomeNames)) {
		if o != Exhausted && seen[o] == 0 {
			t.Errorf("no command of the random logs gave %v", o)
		}
	}
	t.Logf("outcomes %v, %d events", seen, events)
}

// TestReplayIsDeterministic: every replica applies the same log, so every
// replica must reach the same bytes and give the same answers, whether it
// applies the commands as built or as decoded from their log form.
func TestReplayIsDeterministic(t *testing.T) {
	for seed := range uint64(10) {
		log := randomLog(seed, 400)
		a, b := newReplica(), newReplica()
		ra, rb := applyAll(a, log), applyAll(b, log)
		if diff := diffResults(ra, rb); diff != "" {
			t.Fatalf("seed %d: two replays answer differently (-first +second):\n%s", seed, diff)
		}
		if !bytes.Equal(a.Snapshot(), b.Snapshot()) {
			t.Fatalf("seed %d: two replays reach different snapshots", seed)
		}

		// A replica applies what it decodes; an entry that does not decode
		// is refused whole, as Apply refuses an invalid command.
		c := newReplica()
		for i, cmd := range log {
			d, err := DecodeCommand(cmd.Encode())
			if err != nil {
				if ra[i].Outcome != Invalid {
					t.Fatalf("seed %d, command %d: %v applied but its log form does not decode: %v", seed, i, ra[i].Outcome, err)
				}
				continue
			}
			if diff := diffResults(ra[i], c.Apply(d)); diff != "" {
				t.Fatalf("seed %d, command %d: the decoded command answers differently:\n%s", seed, i, diff)
			}
		}
		if !bytes.Equal(a.Snapshot(), c.Snapshot()) {
			t.Fatalf("seed %d: replaying the decoded log reaches a different snapshot", seed)
		}
	}
}

// TestRestoreThenReplayTheRest: a replica restored from a snapshot taken
// after any prefix of the log, then given the rest of the log, ends where a
// replica that applied the whole log ends, answering alike on the way.
func TestRestoreThenReplayTheRest(t *testing.T) {
	for seed := range uint64(5) {
		log := randomLog(100+seed, 300)
		whole := newReplica()
		snaps := make([][]byte, len(log)+1)
		results := make([]Result, len(log))
		for i, c := range log {
			snaps[i] = whole.Snapshot()
			results[i] = whole.Apply(c)
		}
		snaps[len(log)] = whole.Snapshot()
		for cut := range len(log) + 1 {
			s, err := Restore(snaps[cut])
			if err != nil {
				t.Fatalf("seed %d, cut %d: %v", seed, cut, err)
			}
			s.keepIdle = whole.keepIdle
			if diff := diffResults(results[cut:], applyAll(s, log[cut:])); diff != "" {
				t.Fatalf("seed %d, cut %d: the restored state answers the rest of the log differently:\n%s", seed, cut, diff)
			}
			if got := s.Snapshot(); !bytes.Equal(got, snaps[len(log)]) {
				t.Fatalf("seed %d, cut %d: snapshot + rest of the log\n%s\ndiffers from the whole log\n%s", seed, cut, got, snaps[len(log)])
			}
		}
	}
}
