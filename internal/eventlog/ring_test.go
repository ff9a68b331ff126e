package eventlog

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fence-dev/fence"
)

func TestRingReadsInOrderAndForgetsTheOldest(t *testing.T) {
	r := NewRing(4)
	const term = 3
	start := r.Position(term)
	if start != term<<termShift|1 {
		t.Fatalf("start of an empty ring = %d, want the first position of term %d", start, term)
	}
	// Waiting at the first position of a term that has recorded nothing.
	if evs, next, ch, err := r.Read(start, "", 10); err != nil || len(evs) != 0 || next != start || ch == nil {
		t.Fatalf("read of an empty ring = %v, %d, %v", evs, next, err)
	}
	for i, scope := range []string{"a", "b/1", "a", "b/2", "c", "b/3"} {
		e := r.Append(term, Event{Kind: Granted, Scope: scope, Token: uint64(i + 1)})
		if e.Position != start+uint64(i) {
			t.Fatalf("event %d at position %d, want %d", i, e.Position, start+uint64(i))
		}
	}
	// Six appended, four kept: the first two are gone.
	if _, _, _, err := r.Read(start+1, "", 10); !errors.Is(err, fence.ErrMissedEvents) {
		t.Fatalf("reading a forgotten position: %v, want ErrMissedEvents", err)
	}
	evs, next, _, err := r.Read(start+2, "b/", 10)
	if err != nil || len(evs) != 2 || evs[0].Scope != "b/2" || evs[1].Scope != "b/3" || next != start+6 {
		t.Fatalf("read b/ from the oldest = %+v, next %d, %v", evs, next, err)
	}
	if evs, _, _, _ := r.Read(start+2, "", 1); len(evs) != 1 || evs[0].Scope != "a" {
		t.Fatalf("read with limit 1 = %+v", evs)
	}
	// Past the newest is refused: nothing was ever recorded there.
	if _, _, _, err := r.Read(start+7, "", 10); !errors.Is(err, fence.ErrMissedEvents) {
		t.Fatalf("reading ahead: %v, want ErrMissedEvents", err)
	}
	if got := r.Holder("b/2", 4); got != "" {
		t.Fatalf("holder of an event without one = %q", got)
	}
	if got := r.Recent("", 10, nil); len(got) != 4 || got[0].Scope != "a" || got[3].Scope != "b/3" {
		t.Fatalf("recent = %+v, want the four kept, oldest first", got)
	}
}

func TestRingNewTermStartsAfresh(t *testing.T) {
	r := NewRing(8)
	old := r.Append(1, Event{Scope: "a"})
	// A watch started in term 2 before anything happened in it waits at
	// term 2's first position, after every position of term 1.
	start := r.Position(2)
	if start <= old.Position {
		t.Fatalf("term 2 starts at %d, not after term 1's %d", start, old.Position)
	}
	if _, _, _, err := r.Read(start, "", 10); err != nil {
		t.Fatalf("waiting at the start of term 2: %v", err)
	}
	e := r.Append(2, Event{Scope: "b"})
	if e.Position != start {
		t.Fatalf("term 2's first event at %d, want %d", e.Position, start)
	}
	if _, _, _, err := r.Read(old.Position, "", 10); !errors.Is(err, fence.ErrMissedEvents) {
		t.Fatalf("resuming in term 1 on term 2's ring: %v, want ErrMissedEvents", err)
	}
	if err := r.Start(3<<termShift|1, 2); !errors.Is(err, fence.ErrMissedEvents) {
		t.Fatalf("starting in a term to come: %v, want ErrMissedEvents", err)
	}
	if err := r.Start(start+1, 2); err != nil {
		t.Fatalf("starting after the newest event: %v", err)
	}
	r.Close()
	if _, _, _, err := r.Read(start, "", 10); !errors.Is(err, fence.ErrUnavailable) {
		t.Fatalf("reading a closed ring: %v, want ErrUnavailable", err)
	}
}

// TestRingAppendAll: events appended together get the next positions in
// their order, as one by one, past the ring's size too, and a reader
// waiting before them is woken.
func TestRingAppendAll(t *testing.T) {
	one, all := NewRing(4), NewRing(4)
	const term = 2
	one.Append(term, Event{Scope: "x"})
	all.Append(term, Event{Scope: "x"})
	_, next, changed, err := all.Read(all.Position(term), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	batch := []Event{{Scope: "a"}, {Scope: "b"}, {Scope: "c"}, {Scope: "d"}, {Scope: "e"}}
	for _, e := range batch {
		one.Append(term, e)
	}
	all.AppendAll(term, slices.Values(batch))
	select {
	case <-changed:
	default:
		t.Fatal("a waiting reader was not woken")
	}
	want, _, _, err := one.Read(next+2, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	got, gotNext, _, err := all.Read(next+2, "", 10)
	if err != nil || len(got) != 3 || gotNext != next+5 {
		t.Fatalf("read after AppendAll = %+v, next %d, %v; want c, d, e and next %d", got, gotNext, err, next+5)
	}
	for i := range want {
		if got[i].Scope != want[i].Scope || got[i].Position != want[i].Position {
			t.Fatalf("event %d: %+v, want %+v as one by one", i, got[i], want[i])
		}
	}
	all.AppendAll(term, slices.Values([]Event(nil)))
	if p := all.Position(term); p != next+5 {
		t.Fatalf("position after an empty AppendAll: %d, want %d", p, next+5)
	}
}

// TestRingSpacesRenewals: a lease renewed again and again records a
// renewal a quarter of its TTL at most, however many it makes, so that
// one holder cannot push everyone's grants and closings out of the ring;
// renewals spaced as holders renew, and those of another lease of the
// same scope, are all recorded. The positions of the renewals left out are
// not used, and no reader is woken for them.
func TestRingSpacesRenewals(t *testing.T) {
	const term, ttl = 1, 40 * time.Second
	r := NewRing(8)
	at := time.Unix(1_000_000, 0)
	a := fence.LeaseID{1}
	renewal := func(token uint64, id fence.LeaseID, after time.Duration) Event {
		return Event{Kind: Renewed, Scope: "orders", Token: token, LeaseID: id, TTL: ttl, At: at.Add(after)}
	}
	grant := r.Append(term, Event{Kind: Granted, Scope: "other", Token: 1})
	first := r.Append(term, renewal(1, a, 0))
	if first.Position != grant.Position+1 {
		t.Fatalf("first renewal at %d, want %d", first.Position, grant.Position+1)
	}
	_, _, changed, err := r.Read(first.Position+1, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	// A batch naming the lease a thousand times, and renewals a moment
	// apart: none recorded.
	r.AppendAll(term, func(yield func(Event) bool) {
		for range 1000 {
			if !yield(renewal(1, a, 0)) {
				return
			}
		}
	})
	if e := r.Append(term, renewal(1, a, ttl/renewalSpacing-time.Millisecond)); e.Position != 0 {
		t.Fatalf("a renewal just under a quarter TTL after the last one recorded at %d", e.Position)
	}
	select {
	case <-changed:
		t.Fatal("a reader was woken for renewals left out")
	default:
	}
	if p := r.Position(term); p != first.Position+1 {
		t.Fatalf("next position after renewals left out: %d, want %d", p, first.Position+1)
	}
	// A quarter TTL after the last one recorded, and a renewal of another
	// lease of the scope: recorded.
	spaced := r.Append(term, renewal(1, a, ttl/renewalSpacing))
	other := r.Append(term, renewal(2, fence.LeaseID{2}, ttl/renewalSpacing))
	if spaced.Position != first.Position+1 || other.Position != first.Position+2 {
		t.Fatalf("spaced renewal at %d and another lease's at %d, want %d and %d", spaced.Position, other.Position, first.Position+1, first.Position+2)
	}
	evs, _, _, err := r.Read(grant.Position, "", 10)
	if err != nil || len(evs) != 4 {
		t.Fatalf("read = %+v, %v; want the grant and three renewals", evs, err)
	}

	// Once a scope's newest renewal has left the ring, nothing is kept
	// for it, and its next renewal is recorded.
	for i := range 8 {
		r.Append(term, Event{Kind: Granted, Scope: fmt.Sprintf("s/%d", i), Token: 1})
	}
	if len(r.repeats) != 0 {
		t.Fatalf("renewals remembered after they all left the ring: %v", r.repeats)
	}
	if e := r.Append(term, renewal(2, fence.LeaseID{2}, ttl/renewalSpacing)); e.Position == 0 {
		t.Fatal("a renewal whose last one left the ring was left out")
	}
	// A new term starts afresh.
	if e := r.Append(term+1, renewal(2, fence.LeaseID{2}, ttl/renewalSpacing)); e.Position == 0 {
		t.Fatal("the first renewal of a new term was left out")
	}
	if len(r.repeats) != 1 {
		t.Fatalf("renewals remembered in the new term: %v, want orders alone", r.repeats)
	}
}

// TestRingRecordsALossOnce: a lease is lost for good, so its renewals
// answered lost, however many and however far apart, record one loss while
// it is retained, even between the losses of another lease of the scope,
// which records one too; the lease's loss is recorded again once the
// first has left the ring.
func TestRingRecordsALossOnce(t *testing.T) {
	const term = 1
	r := NewRing(4)
	at := time.Unix(1_000_000, 0)
	loss := func(token uint64, after time.Duration) Event {
		return Event{Kind: Lost, Scope: "orders", Token: token, LeaseID: fence.LeaseID{byte(token)}, TTL: time.Second, At: at.Add(after), Current: 9}
	}
	start := r.Position(term)
	for i := range 1000 {
		r.Append(term, loss(1, time.Duration(i)*time.Hour))
		r.Append(term, loss(2, time.Duration(i)*time.Hour))
	}
	evs, next, _, err := r.Read(start, "", 10)
	if err != nil || len(evs) != 2 || evs[0].Token != 1 || evs[1].Token != 2 || next != start+2 {
		t.Fatalf("after 1000 losses of each of two leases: %+v, next %d, %v; want one loss each", evs, next, err)
	}
	for i := range 3 {
		r.Append(term, Event{Kind: Granted, Scope: fmt.Sprintf("s/%d", i), Token: 1})
	}
	// The ring holds the second lease's loss and the three grants.
	if e := r.Append(term, loss(2, 2000*time.Hour)); e.Position != 0 {
		t.Fatal("a loss still retained was recorded again")
	}
	if e := r.Append(term, loss(1, 2000*time.Hour)); e.Position == 0 {
		t.Fatal("a loss whose first record left the ring was left out")
	}
}

// TestRingNamesALossHolder: a renewal answered lost after its lease left
// the state comes without a holder; the loss recorded names the one of the
// lease's newest event still retained (its grant here), and a loss that
// names one keeps it. The server once looked the holder up before every
// loss, recorded or left out: a scan of the ring each.
func TestRingNamesALossHolder(t *testing.T) {
	const term = 1
	r := NewRing(8)
	id := fence.LeaseID{1}
	r.Append(term, Event{Kind: Granted, Scope: "orders", Token: 5, Holder: "worker-1", LeaseID: id})
	r.Append(term, Event{Kind: Granted, Scope: "other", Token: 5, Holder: "worker-2"})
	if e := r.Append(term, Event{Kind: Lost, Scope: "orders", Token: 5, LeaseID: id}); e.Position == 0 || e.Holder != "worker-1" {
		t.Fatalf("a loss without a holder recorded as %+v; want it recorded, naming worker-1", e)
	}
	if e := r.Append(term, Event{Kind: Lost, Scope: "orders", Token: 6, Holder: "worker-3", LeaseID: fence.LeaseID{2}}); e.Holder != "worker-3" {
		t.Fatalf("a loss naming its holder recorded as %+v; want worker-3 kept", e)
	}
	if e := r.Append(term, Event{Kind: Lost, Scope: "orders", Token: 9, LeaseID: fence.LeaseID{3}}); e.Position == 0 || e.Holder != "" {
		t.Fatalf("a loss of a lease the ring has no event of recorded as %+v; want it recorded without a holder", e)
	}
}

// TestRingBoundsRejections: a stale token refused again and again on a
// scope, whatever guard reports it, records one rejection while it is
// retained, and since reporters may name any token and scope, rejections
// take a tenth of the ring at most: the rest are left out, their positions
// unused and no reader woken, until some leave the ring. A grant before
// them all stays readable.
func TestRingBoundsRejections(t *testing.T) {
	const term, size = 1, 30 // room for 3 rejections
	r := NewRing(size)
	at := time.Unix(1_000_000, 0)
	rejection := func(scope string, token uint64, guard string) Event {
		return Event{Kind: Rejected, Scope: scope, Token: token, Current: token + 1, Guard: guard, At: at}
	}
	grant := r.Append(term, Event{Kind: Granted, Scope: "billing/a", Token: 1})
	r.AppendAll(term, func(yield func(Event) bool) {
		for i := range 1000 {
			if !yield(rejection("orders/a", 1, fmt.Sprint("guard-", i%3))) {
				return
			}
		}
	})
	if p := r.Position(term); p != grant.Position+2 {
		t.Fatalf("next position after a token refused 1000 times: %d, want %d (one rejection recorded)", p, grant.Position+2)
	}
	// Another token of the scope, and the same token of another scope:
	// recorded, and the rejections have their share.
	if e := r.Append(term, rejection("orders/a", 2, "guard-0")); e.Position != grant.Position+2 {
		t.Fatalf("another token's rejection at %d, want %d", e.Position, grant.Position+2)
	}
	if e := r.Append(term, rejection("orders/b", 1, "guard-0")); e.Position != grant.Position+3 {
		t.Fatalf("another scope's rejection at %d, want %d", e.Position, grant.Position+3)
	}
	_, _, changed, err := r.Read(grant.Position+4, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	// Eleven reports of 1000 rejections, each of a new token or scope,
	// would have pushed billing/a's grant out of a ring of 10,000.
	for i := range 11 * 1000 {
		if e := r.Append(term, rejection(fmt.Sprint("orders/", i%1000), uint64(10+i), "guard-0")); e.Position != 0 {
			t.Fatalf("rejection %d recorded at %d past the rejections' share of the ring", i, e.Position)
		}
	}
	select {
	case <-changed:
		t.Fatal("a reader was woken for rejections left out")
	default:
	}
	evs, _, _, err := r.Read(grant.Position, "billing/", 10)
	if err != nil || len(evs) != 1 || evs[0].Token != 1 {
		t.Fatalf("billing/ from before the rejections: %+v, %v; want its grant", evs, err)
	}

	// Once rejections leave the ring, others take their room, and the
	// same token refused again is recorded again.
	for i := range size - 1 { // the grant and two rejections leave
		r.Append(term, Event{Kind: Granted, Scope: fmt.Sprintf("s/%d", i), Token: 1})
	}
	if r.rejections != 1 {
		t.Fatalf("%d rejections counted with one left in the ring", r.rejections)
	}
	if e := r.Append(term, rejection("orders/a", 1, "guard-1")); e.Position == 0 {
		t.Fatal("a rejection whose first record left the ring was left out")
	}
	// That pushed the last of the first three out: room for two more.
	for _, scope := range []string{"orders/c", "orders/d"} {
		if e := r.Append(term, rejection(scope, 5, "guard-1")); e.Position == 0 {
			t.Fatalf("a rejection of %s left out with room for it in the ring", scope)
		}
	}
	if e := r.Append(term, rejection("orders/e", 5, "guard-1")); e.Position != 0 {
		t.Fatal("a rejection recorded past the rejections' share of the ring")
	}
	// A new term starts afresh.
	if e := r.Append(term+1, rejection("orders/d", 5, "guard-1")); e.Position == 0 {
		t.Fatal("the first rejection of a new term was left out")
	}
	if r.rejections != 1 || len(r.repeats) != 1 {
		t.Fatalf("%d rejections counted and %v remembered in the new term, want orders/d alone", r.rejections, r.repeats)
	}
}

// TestRingLooksHoldersUpInOneRead: a report of 1000 rejections of tokens
// the ring has never seen, against a full ring, names no holder and reads
// no event, as losses of such leases do; a token whose events are retained
// is named from the newest that names its holder, in one read, until they
// all leave the ring. Holder once scanned the ring for each rejection
// reported, under its lock: ten million events read a report.
func TestRingLooksHoldersUpInOneRead(t *testing.T) {
	const term = 1
	r := NewRing(RingSize)
	at := time.Unix(1_000_000, 0)
	for i := range RingSize {
		r.Append(term, Event{Kind: Granted, Scope: fmt.Sprint("orders/", i), Token: uint64(i + 1), Holder: fmt.Sprint("worker-", i), At: at})
	}
	// As ReportRejections does with each rejection of a report.
	for i := range 1000 {
		scope, token := fmt.Sprint("orders/", i), uint64(RingSize+1+i)
		h := r.Holder(scope, token)
		if h != "" {
			t.Fatalf("holder of unknown token %d of %s: %q", token, scope, h)
		}
		r.Append(term, Event{Kind: Rejected, Scope: scope, Token: token, Holder: h, Current: token + 1, Guard: "guard-0", At: at})
		if e := r.Append(term, Event{Kind: Lost, Scope: scope, Token: token, LeaseID: fence.LeaseID{byte(i), byte(i >> 8)}, At: at}); e.Holder != "" {
			t.Fatalf("loss of unknown token %d of %s names %q", token, scope, e.Holder)
		}
	}
	if r.holderReads != 0 {
		t.Fatalf("2000 lookups of unknown tokens read %d events; want none", r.holderReads)
	}
	const known = RingSize - 1 // the newest grant: the rejections and losses pushed out the first 2000
	if h := r.Holder(fmt.Sprint("orders/", known), known+1); h != fmt.Sprint("worker-", known) || r.holderReads != 1 {
		t.Fatalf("holder of a retained grant: %q after %d reads; want worker-%d after one", h, r.holderReads, known)
	}
	if h := r.Holder("orders/0", 1); h != "" {
		t.Fatalf("holder of a grant that left the ring: %q", h)
	}

	// A renewal retained names the holder after its grant left; once it
	// leaves too, nothing does.
	small := NewRing(4)
	small.Append(term, Event{Kind: Granted, Scope: "a", Token: 7, Holder: "worker-1", At: at})
	small.Append(term, Event{Kind: Renewed, Scope: "a", Token: 7, Holder: "worker-1", LeaseID: fence.LeaseID{1}, TTL: time.Second, At: at})
	for i := range 4 { // the third pushes the grant out, the fourth the renewal
		small.Append(term, Event{Kind: Granted, Scope: "b", Token: uint64(i + 1), Holder: "worker-2", At: at})
		want := "worker-1"
		if i == 3 {
			want = ""
		}
		if h := small.Holder("a", 7); h != want {
			t.Fatalf("holder of a/7 after %d grants of b: %q, want %q", i+1, h, want)
		}
	}
	if n := len(small.repeats); n > 2*4 {
		t.Fatalf("%d entries remembered for a ring of 4: %v", n, small.repeats)
	}
}
