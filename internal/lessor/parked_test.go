package lessor

import (
	"slices"
	"testing"
	"time"

	"github.com/fence-dev/fence/internal/fsm"
)

// The tests of parked run no goroutine and read no clock: the policy is
// its inputs and outputs.

var t0 = time.Unix(1_000_000, 0)

func parkedJoin(scope, holder string, at time.Duration) *join {
	return &join{c: fsm.Command{Op: fsm.OpAcquire, Scope: scope, Holder: holder, Wait: true}, at: t0.Add(at)}
}

func holders(js []*join) []string {
	var out []string
	for _, j := range js {
		out = append(out, j.c.Holder)
	}
	return out
}

// TestParkedTakesAScopeInArrivalOrder: a scope's acquires go from the
// front, as many as the entry has room for, and none of the scope while
// some taken are not yet answered; once answered, those parked behind
// may go.
func TestParkedTakesAScopeInArrivalOrder(t *testing.T) {
	p := newParked(time.Hour)
	if !p.first("s") {
		t.Fatal("an empty scope is not first")
	}
	for i, h := range []string{"a", "b", "c"} {
		if n := p.add(parkedJoin("s", h, time.Duration(i))); n != i+1 {
			t.Fatalf("add: %d parked, want %d", n, i+1)
		}
	}
	if p.first("s") {
		t.Fatal("a scope with acquires parked is first")
	}
	taken := p.take(2)
	if got := holders(taken); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("took %v, want [a b]", got)
	}
	p.add(parkedJoin("s", "d", 3))
	if got := p.take(10); len(got) != 0 {
		t.Fatalf("took %v while the scope's entry is on its way", holders(got))
	}
	if p.first("s") {
		t.Fatal("a scope with acquires on their way is first")
	}
	if !p.answered(taken) {
		t.Fatal("answered: the acquires parked behind may not go")
	}
	if got := holders(p.take(10)); !slices.Equal(got, []string{"c", "d"}) {
		t.Fatalf("then took %v, want [c d]", got)
	}
	if p.n != 0 {
		t.Fatalf("%d parked after taking them all", p.n)
	}
}

// TestParkedTakesOtherScopesMeanwhile: a scope whose entry is on its way
// holds back only its own acquires.
func TestParkedTakesOtherScopesMeanwhile(t *testing.T) {
	p := newParked(time.Hour)
	p.add(parkedJoin("s", "a", 0))
	first := p.take(10)
	p.add(parkedJoin("s", "b", 1))
	p.add(parkedJoin("o", "x", 2))
	if got := holders(p.take(10)); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("took %v, want [x]", got)
	}
	if p.answered(first) == false {
		t.Fatal("answered: b may not go")
	}
	if got := holders(p.take(10)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("took %v, want [b]", got)
	}
}

// TestParkedRemove: an acquire still parked is taken back; one taken into
// an entry is not, its entry answers it.
func TestParkedRemove(t *testing.T) {
	p := newParked(time.Hour)
	a, b, c := parkedJoin("s", "a", 0), parkedJoin("s", "b", 1), parkedJoin("s", "c", 2)
	p.add(a)
	taken := p.take(1)
	p.add(b)
	p.add(c)
	if p.remove(a) {
		t.Fatal("removed an acquire already taken")
	}
	if !p.remove(b) {
		t.Fatal("did not remove a parked acquire")
	}
	if p.n != 1 {
		t.Fatalf("%d parked, want 1", p.n)
	}
	p.answered(taken)
	if got := holders(p.take(10)); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("took %v, want [c]", got)
	}
}

// TestParkedDue: nothing is due with nothing parked, or with only scopes
// whose entries are on their way; the oldest of the others is due once it
// has waited maxPark.
func TestParkedDue(t *testing.T) {
	const maxPark = 5 * time.Millisecond
	p := newParked(maxPark)
	if due, next := p.due(t0); due || !next.IsZero() {
		t.Fatalf("nothing parked: due %v, next %v", due, next)
	}
	p.add(parkedJoin("s", "a", 0))
	taken := p.take(1)
	p.add(parkedJoin("s", "b", time.Millisecond))
	if due, next := p.due(t0.Add(time.Hour)); due || !next.IsZero() {
		t.Fatalf("only a scope on its way: due %v, next %v", due, next)
	}
	p.add(parkedJoin("o", "x", 2*time.Millisecond))
	if due, next := p.due(t0.Add(3 * time.Millisecond)); due || !next.Equal(t0.Add(2*time.Millisecond+maxPark)) {
		t.Fatalf("x parked 1ms: due %v, next %v, want false, %v", due, next, t0.Add(2*time.Millisecond+maxPark))
	}
	if due, _ := p.due(t0.Add(2*time.Millisecond + maxPark)); !due {
		t.Fatal("x parked maxPark: not due")
	}
	p.answered(taken)
	if due, next := p.due(t0.Add(3 * time.Millisecond)); due || !next.Equal(t0.Add(time.Millisecond+maxPark)) {
		t.Fatalf("b may go again: due %v, next %v, want false, %v", due, next, t0.Add(time.Millisecond+maxPark))
	}
}

// TestParkedAnyFree: a free scope makes its parked acquires go, unless
// its entry is on its way.
func TestParkedAnyFree(t *testing.T) {
	p := newParked(time.Hour)
	if p.anyFree(func(string) bool { return true }) {
		t.Fatal("nothing parked, yet free")
	}
	p.add(parkedJoin("s", "a", 0))
	taken := p.take(1)
	p.add(parkedJoin("s", "b", 1))
	if p.anyFree(func(string) bool { return true }) {
		t.Fatal("free while its entry is on its way")
	}
	p.add(parkedJoin("o", "x", 2))
	free := map[string]bool{"o": false}
	if p.anyFree(func(scope string) bool { return free[scope] }) {
		t.Fatal("free while o is held")
	}
	free["o"] = true
	if !p.anyFree(func(scope string) bool { return free[scope] }) {
		t.Fatal("o free, yet not")
	}
	p.answered(taken)
	if !p.anyFree(func(scope string) bool { return scope == "s" }) {
		t.Fatal("s answered and free, yet not")
	}
}

// TestParkedClear: leaving office takes every parked acquire back.
func TestParkedClear(t *testing.T) {
	p := newParked(time.Hour)
	p.add(parkedJoin("s", "a", 0))
	p.add(parkedJoin("s", "b", 1))
	p.add(parkedJoin("o", "x", 2))
	by := p.clear()
	if got := holders(by["s"]); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("cleared %v of s, want [a b]", got)
	}
	if got := holders(by["o"]); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("cleared %v of o, want [x]", got)
	}
	if p.n != 0 || len(p.by) != 0 || p.take(10) != nil {
		t.Fatal("acquires left after clear")
	}
}
