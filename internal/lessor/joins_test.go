package lessor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// eventRecorder is a recorder that hands each entry's events to the
// lessor, as a node does.
type eventRecorder struct {
	recorder
	l *Lessor
}

func (r *eventRecorder) Apply(ctx context.Context, c fsm.Command) (fsm.Result, error) {
	res, err := r.recorder.Apply(ctx, c)
	r.l.Applied(res.Events, time.Now())
	return res, err
}

func (r *eventRecorder) entries() []fsm.Command {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]fsm.Command(nil), r.proposed...)
}

// parkingLessor returns a lessor in office on a recorded node at the given
// log format, whose parked acquires go only with another entry.
func parkingLessor(t *testing.T, format int) (*Lessor, *eventRecorder) {
	t.Helper()
	st := fsm.New()
	st.Apply(fsm.Command{Op: fsm.OpSetFormat, Format: format})
	l := New(Config{})
	node := &eventRecorder{recorder: recorder{st: st}, l: l}
	l.Open(node)
	l.joins.p.maxPark = time.Hour
	l.mu.Lock()
	l.enterLocked()
	l.mu.Unlock()
	return l, node
}

func waitingAcquire(scope, holder string) fsm.Command {
	return fsm.Command{Op: fsm.OpAcquire, Scope: scope, LeaseID: fence.NewLeaseID(), Holder: holder,
		TTL: time.Minute, Wait: true, At: time.Now().UnixNano()}
}

type answer struct {
	r   fsm.Result
	err error
}

// acquireAsync starts a waiting acquire and returns once it is parked
// (parked acquires in all reaches n).
func acquireAsync(t *testing.T, ctx context.Context, l *Lessor, c fsm.Command, n int32) chan answer {
	t.Helper()
	done := make(chan answer, 1)
	go func() {
		r, err := l.Acquire(ctx, c)
		done <- answer{r, err}
	}()
	for end := time.Now().Add(20 * time.Second); l.joins.n.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d acquires parked after 20s, want %d", l.joins.n.Load(), n)
		}
	}
	return done
}

func await(t *testing.T, ch chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no answer after 20s")
		return answer{}
	}
}

// TestWaitersRideTheRelease: waiting acquires for a held scope cost no
// entry of their own: the release carries them, in the order they came,
// and grants the first; the next releases grant the others in that order.
func TestWaitersRideTheRelease(t *testing.T) {
	l, node := parkingLessor(t, fsm.WaitBatchFormat)
	ctx := context.Background()
	held, err := l.Acquire(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: "s", LeaseID: fence.NewLeaseID(), Holder: "a", TTL: time.Minute, At: time.Now().UnixNano()})
	if err != nil || held.Outcome != fsm.Granted {
		t.Fatalf("first acquire: %v, %v", held.Outcome, err)
	}
	var waiting []fsm.Command
	var answers []chan answer
	for i, h := range []string{"b", "c", "d"} {
		c := waitingAcquire("s", h)
		waiting = append(waiting, c)
		answers = append(answers, acquireAsync(t, ctx, l, c, int32(i+1)))
	}
	before := len(node.entries())
	if before != 1 {
		t.Fatalf("%d entries before the release, want 1: the waiters were proposed on their own", before)
	}
	if _, err := l.Release(ctx, "s", held.Lease.ID); err != nil {
		t.Fatal(err)
	}
	es := node.entries()
	if len(es) != 2 || es[1].Op != fsm.OpBatch || len(es[1].Commands) != 4 {
		t.Fatalf("entries %+v; want the first acquire, then one batch of the three waiters and the release", es)
	}
	for i, c := range waiting {
		if got := es[1].Commands[i].LeaseID; got != c.LeaseID {
			t.Fatalf("batch command %d: lease %v, want the waiter that came %d (%v)", i, got, i+1, c.LeaseID)
		}
	}
	for i, c := range waiting {
		a := await(t, answers[i])
		if a.err != nil || a.r.Outcome != fsm.Granted || a.r.Lease.ID != c.LeaseID {
			t.Fatalf("waiter %d: %v, %v; want granted", i, a.r.Outcome, a.err)
		}
		if i+1 < len(answers) {
			select {
			case a := <-answers[i+1]:
				t.Fatalf("waiter %d answered before waiter %d released: %v, %v", i+1, i, a.r.Outcome, a.err)
			default:
			}
		}
		if _, err := l.Release(ctx, "s", c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(node.entries()); n != 5 {
		t.Errorf("%d entries, want 5: an acquire, a batch and three releases", n)
	}
}

// TestParkedWaiterGivesUp: a waiter that gives up before any entry
// carried it leaves no trace: nothing is proposed for it, and the release
// frees the scope.
func TestParkedWaiterGivesUp(t *testing.T) {
	l, node := parkingLessor(t, fsm.WaitBatchFormat)
	ctx := context.Background()
	held, err := l.Acquire(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: "s", LeaseID: fence.NewLeaseID(), Holder: "a", TTL: time.Minute, At: time.Now().UnixNano()})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := acquireAsync(t, wctx, l, waitingAcquire("s", "b"), 1)
	cancel()
	if a := await(t, done); !errors.Is(a.err, context.Canceled) {
		t.Fatalf("waiter that gave up: %v, %v; want context.Canceled", a.r.Outcome, a.err)
	}
	if n := l.joins.n.Load(); n != 0 {
		t.Fatalf("%d parked after the waiter gave up, want 0", n)
	}
	if _, err := l.Release(ctx, "s", held.Lease.ID); err != nil {
		t.Fatal(err)
	}
	es := node.entries()
	if len(es) != 2 || es[1].Op != fsm.OpRelease {
		t.Fatalf("entries %+v; want the acquire and the release alone", es)
	}
	var in fsm.ScopeInfo
	node.Read(func(st *fsm.State) { in = st.Get("s") })
	if in.Lease != nil || in.Waiters != 0 {
		t.Fatalf("scope after the release: %+v; want free", in)
	}
}

// TestParkedWaitersLeaveWithTheOffice: a leader that leaves office answers
// its parked waiters at once, unavailable, so that they retry at the next.
func TestParkedWaitersLeaveWithTheOffice(t *testing.T) {
	l, _ := parkingLessor(t, fsm.WaitBatchFormat)
	ctx := context.Background()
	if _, err := l.Acquire(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: "s", LeaseID: fence.NewLeaseID(), Holder: "a", TTL: time.Minute, At: time.Now().UnixNano()}); err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(t, ctx, l, waitingAcquire("s", "b"), 1)
	l.Lead(false)
	if a := await(t, done); !errors.Is(a.err, fence.ErrUnavailable) {
		t.Fatalf("parked waiter of a deposed leader: %v, %v; want unavailable", a.r.Outcome, a.err)
	}
	// Out of office, nothing parks: the acquire is proposed as it comes.
	r, err := l.Acquire(ctx, waitingAcquire("t", "c"))
	if err != nil || r.Outcome != fsm.Granted {
		t.Fatalf("acquire out of office: %v, %v; want granted at once", r.Outcome, err)
	}
}

// TestNoParkingBelowWaitBatchFormat: below the format whose batches carry
// waiting acquires, a waiter is proposed on its own, as before.
func TestNoParkingBelowWaitBatchFormat(t *testing.T) {
	l, node := parkingLessor(t, fsm.WaitBatchFormat-1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := l.Acquire(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: "s", LeaseID: fence.NewLeaseID(), Holder: "a", TTL: time.Minute, At: time.Now().UnixNano()}); err != nil {
		t.Fatal(err)
	}
	go l.Acquire(ctx, waitingAcquire("s", "b"))
	for end := time.Now().Add(20 * time.Second); len(node.entries()) < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the waiting acquire was not proposed")
		}
	}
	if es := node.entries(); es[1].Op != fsm.OpAcquire || !es[1].Wait {
		t.Fatalf("second entry %+v; want the waiting acquire alone", es[1])
	}
	if n := l.joins.n.Load(); n != 0 {
		t.Fatalf("%d parked under format %d", n, fsm.WaitBatchFormat-1)
	}
}

// TestParkedWaiterGoesWhenTheScopeFrees: on a real node, a waiter parked
// behind a lease that expires (an entry that carries no waiter) is
// proposed once the scope is free, and one parked behind a lease that
// stays is proposed after maxPark, so queries show it in line.
func TestParkedWaiterGoesWhenTheScopeFrees(t *testing.T) {
	l, node := startLessor(t)
	for end := time.Now().Add(20 * time.Second); node.Format() < fsm.WaitBatchFormat; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("log format %d, want %d", node.Format(), fsm.WaitBatchFormat)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acquire := func(scope string, ttl time.Duration) fsm.Result {
		r, err := l.Acquire(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: scope, LeaseID: fence.NewLeaseID(), Holder: "a", TTL: ttl, At: time.Now().UnixNano()})
		if err != nil || r.Outcome != fsm.Granted {
			t.Fatalf("acquire %s: %v, %v", scope, r.Outcome, err)
		}
		return r
	}
	acquire("long", time.Hour)
	acquire("short", 300*time.Millisecond)

	l.joins.mu.Lock()
	l.joins.p.maxPark = time.Hour
	l.joins.mu.Unlock()
	done := acquireAsync(t, ctx, l, waitingAcquire("short", "b"), 1)
	if a := await(t, done); a.err != nil || a.r.Outcome != fsm.Granted || a.r.Lease.Holder != "b" {
		t.Fatalf("waiter behind an expiring lease: %v, %v; want granted to b", a.r.Outcome, a.err)
	}

	l.joins.mu.Lock()
	l.joins.p.maxPark = 10 * time.Millisecond
	l.joins.mu.Unlock()
	go l.Acquire(ctx, waitingAcquire("long", "c"))
	awaitInLine(t, node, "long", 1)
}

// awaitInLine waits until n acquires wait in scope's line in the state.
func awaitInLine(t *testing.T, node Node, scope string, n int) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
		var in fsm.ScopeInfo
		node.Read(func(st *fsm.State) { in = st.Get(scope) })
		if in.Waiters == n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("scope %s: %+v after 20s; want %d in line", scope, in, n)
		}
	}
}

// TestWaitersHandOff runs many waiting holders on two scopes on a real
// node, some giving up while they wait: no scope ever has two holders,
// tokens rise, and every waiter is answered.
func TestWaitersHandOff(t *testing.T) {
	l, _ := startLessor(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const workers, rounds = 12, 25
	var (
		holding [2]atomic.Bool
		mu      sync.Mutex
		last    = map[string]uint64{}
		granted atomic.Int32
		gaveUp  atomic.Int32
	)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range rounds {
				i := rng.IntN(2)
				scope := fmt.Sprintf("s%d", i)
				actx, acancel := ctx, context.CancelFunc(func() {})
				if rng.IntN(4) == 0 {
					actx, acancel = context.WithTimeout(ctx, time.Duration(rng.IntN(3000))*time.Microsecond)
				}
				r, err := l.Acquire(actx, waitingAcquire(scope, fmt.Sprintf("w%d", w)))
				stopped := actx.Err() != nil
				acancel()
				if err != nil {
					if ctx.Err() != nil || !stopped {
						errs <- fmt.Errorf("worker %d: %v, and it had not given up", w, err)
						return
					}
					gaveUp.Add(1)
					continue
				}
				if r.Outcome != fsm.Granted {
					errs <- fmt.Errorf("worker %d: %v, want granted", w, r.Outcome)
					return
				}
				if !holding[i].CompareAndSwap(false, true) {
					errs <- fmt.Errorf("worker %d granted %s while another held it", w, scope)
					return
				}
				mu.Lock()
				prev := last[scope]
				last[scope] = r.Lease.Token
				mu.Unlock()
				if r.Lease.Token <= prev {
					errs <- fmt.Errorf("%s: token %d after %d", scope, r.Lease.Token, prev)
					return
				}
				granted.Add(1)
				holding[i].Store(false)
				if rr, err := l.Release(ctx, scope, r.Lease.ID); err != nil || rr.Outcome != fsm.Released {
					errs <- fmt.Errorf("worker %d release: %v, %v", w, rr.Outcome, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if granted.Load() == 0 || gaveUp.Load() == 0 {
		t.Errorf("%d grants, %d gave up: the run did not exercise both", granted.Load(), gaveUp.Load())
	}
	if n := l.joins.n.Load(); n != 0 {
		t.Errorf("%d still parked at the end", n)
	}
}

// TestWaiterInLineLeavesWithTheOffice: a waiter already in the state
// machine's line is answered unavailable when its leader leaves office,
// though the node applies nothing more: a leader deposed and cut off never
// applies the next leader's promote, which drops the line.
func TestWaiterInLineLeavesWithTheOffice(t *testing.T) {
	l, node := parkingLessor(t, fsm.WaitBatchFormat-1) // no parking: straight into the line
	ctx := context.Background()
	if _, err := l.Acquire(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: "s", LeaseID: fence.NewLeaseID(), Holder: "a", TTL: time.Minute, At: time.Now().UnixNano()}); err != nil {
		t.Fatal(err)
	}
	done := make(chan answer, 1)
	go func() {
		r, err := l.Acquire(ctx, waitingAcquire("s", "b"))
		done <- answer{r, err}
	}()
	awaitInLine(t, node, "s", 1)
	select {
	case a := <-done:
		t.Fatalf("waiter in line answered before the leader left: %v, %v", a.r.Outcome, a.err)
	default:
	}
	l.Lead(false)
	if a := await(t, done); !errors.Is(a.err, fence.ErrUnavailable) {
		t.Fatalf("waiter in line at a deposed leader: %v, %v; want unavailable", a.r.Outcome, a.err)
	}
}

// readGate blocks the nth Read of a node after it is armed, until opened.
type readGate struct {
	*eventRecorder
	mu      sync.Mutex
	left    int           // Reads to let pass before blocking; -1: disarmed
	blocked chan struct{} // closed when a Read blocks
	open    chan struct{}
}

func (g *readGate) Read(f func(*fsm.State)) {
	g.mu.Lock()
	block := g.left == 0
	if g.left >= 0 {
		g.left--
	}
	g.mu.Unlock()
	if block {
		close(g.blocked)
		<-g.open
	}
	g.eventRecorder.Read(f)
}

// TestLetThroughWaiterKeepsItsPlace: a waiting acquire for a free scope,
// proposed at once, keeps its place ahead of a waiter that came after it,
// even when that one parks before the first is proposed and rides the
// first one's entry. Here the first is held up between being let through
// and proposing (at its second Read of the state) while another acquire
// takes the scope and a second waiter parks behind that holder.
func TestLetThroughWaiterKeepsItsPlace(t *testing.T) {
	l, rec := parkingLessor(t, fsm.WaitBatchFormat)
	gate := &readGate{eventRecorder: rec, left: 1, blocked: make(chan struct{}), open: make(chan struct{})}
	l.node = gate
	ctx := context.Background()
	first := waitingAcquire("s", "first")
	firstDone := make(chan answer, 1)
	go func() {
		r, err := l.Acquire(ctx, first)
		firstDone <- answer{r, err}
	}()
	select {
	case <-gate.blocked:
	case <-time.After(20 * time.Second):
		t.Fatal("the first waiter did not reach its second Read within 20s")
	}
	x, err := l.Acquire(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: "s", LeaseID: fence.NewLeaseID(), Holder: "x", TTL: time.Minute, At: time.Now().UnixNano()})
	if err != nil {
		t.Fatal(err)
	}
	second := waitingAcquire("s", "second")
	secondDone := acquireAsync(t, ctx, l, second, 1)
	close(gate.open)
	if x.Outcome == fsm.Granted {
		if _, err := l.Release(ctx, "s", x.Lease.ID); err != nil {
			t.Fatal(err)
		}
	}
	grantedInOrder(t, l, first, firstDone, second, secondDone)
}

// grantedInOrder wants the waiting acquire first, of scope s, granted, and
// once it is released, second.
func grantedInOrder(t *testing.T, l *Lessor, first fsm.Command, firstDone chan answer, second fsm.Command, secondDone chan answer) {
	t.Helper()
	var a answer
	var want, other fsm.Command
	var otherDone chan answer
	select {
	case a = <-firstDone:
		want, other, otherDone = first, second, secondDone
	case a = <-secondDone:
		want, other, otherDone = second, first, firstDone
		t.Errorf("the waiter that came second was granted first")
	case <-time.After(20 * time.Second):
		t.Fatal("neither waiter answered within 20s")
	}
	if a.err != nil || a.r.Outcome != fsm.Granted || a.r.Lease.ID != want.LeaseID {
		t.Fatalf("first answer: %v, %v", a.r.Outcome, a.err)
	}
	if _, err := l.Release(context.Background(), "s", want.LeaseID); err != nil {
		t.Fatal(err)
	}
	if b := await(t, otherDone); b.err != nil || b.r.Lease.ID != other.LeaseID {
		t.Fatalf("second answer: %v, %v", b.r.Outcome, b.err)
	}
}

// applyGate blocks the Apply of the first entry that carries the lease ID
// id, after it was taken and before the node has it, until opened.
type applyGate struct {
	*eventRecorder
	id      fence.LeaseID
	once    sync.Once
	blocked chan struct{} // closed when that Apply blocks
	open    chan struct{}
}

func (g *applyGate) Apply(ctx context.Context, c fsm.Command) (fsm.Result, error) {
	carries := c.LeaseID == g.id
	for _, b := range c.Commands {
		carries = carries || b.LeaseID == g.id
	}
	if carries {
		g.once.Do(func() {
			close(g.blocked)
			<-g.open
		})
	}
	return g.eventRecorder.Apply(ctx, c)
}

// TestEntriesKeepAScopesWaitersInOrder: two entries that each carry a
// waiter of one scope reach the log in the order the waiters came. Here
// the entry that took the first waiter is held up before the node has it,
// while the second waiter parks and another entry is proposed: that one
// must not carry the second in front of the first.
func TestEntriesKeepAScopesWaitersInOrder(t *testing.T) {
	l, rec := parkingLessor(t, fsm.WaitBatchFormat)
	ctx := context.Background()
	x, err := l.Acquire(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: "s", LeaseID: fence.NewLeaseID(), Holder: "x", TTL: time.Minute, At: time.Now().UnixNano()})
	if err != nil || x.Outcome != fsm.Granted {
		t.Fatalf("the holder's acquire: %v, %v", x.Outcome, err)
	}
	first := waitingAcquire("s", "first")
	gate := &applyGate{eventRecorder: rec, id: first.LeaseID, blocked: make(chan struct{}), open: make(chan struct{})}
	l.node = gate
	firstDone := acquireAsync(t, ctx, l, first, 1)
	other := func(scope string) error {
		_, err := l.Acquire(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: scope, LeaseID: fence.NewLeaseID(), Holder: "o", TTL: time.Minute, At: time.Now().UnixNano()})
		return err
	}
	carrier := make(chan error, 1)
	go func() { carrier <- other("o") }() // takes the first waiter
	select {
	case <-gate.blocked:
	case <-time.After(20 * time.Second):
		t.Fatal("no entry carried the first waiter within 20s")
	}
	second := waitingAcquire("s", "second")
	secondDone := acquireAsync(t, ctx, l, second, 1)
	if err := other("p"); err != nil { // may take the second waiter
		t.Fatal(err)
	}
	close(gate.open)
	if err := <-carrier; err != nil {
		t.Fatal(err)
	}
	if _, err := l.Release(ctx, "s", x.Lease.ID); err != nil {
		t.Fatal(err)
	}
	grantedInOrder(t, l, first, firstDone, second, secondDone)
}
