package lessor

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fence-dev/fence/internal/fsm"
)

// Node is the replicated state machine the lessor proposes to and reads.
type Node interface {
	// Read runs f under the state machine's read lock.
	Read(f func(*fsm.State))
	Apply(ctx context.Context, c fsm.Command) (fsm.Result, error)
	// Barrier returns once every entry committed before it is applied.
	Barrier(ctx context.Context) error
	// ConfirmLeader returns once this node is known to have led at some
	// moment after the call, or with an error if that cannot be known.
	ConfirmLeader(ctx context.Context) error
	// RaiseFormat raises the cluster's log format to the highest this
	// build knows, if every member knows it; an error says why it did not.
	RaiseFormat(ctx context.Context) error
}

// Config configures a Lessor.
type Config struct {
	Logger *slog.Logger
	// TakeOffice, if set, runs when a new leader has extended every lease,
	// before it serves: the server's own steps of taking office.
	TakeOffice func(ctx context.Context) error
	// Queued, if set, is called when an acquire joins a line; the function
	// it returns is called when the wait ends.
	Queued func() (done func(granted bool))
	// Admit, if set, is asked before an acquire is proposed (alone or in a
	// batch): an error refuses it, a limit reached; the acquire is then
	// not proposed. Done is called once the acquire is answered.
	Admit func(c fsm.Command) (done func(), err error)
	// TokenFloor is a token floor the operator asks for: every token
	// granted after this node takes office is above it (and above the
	// wall clock in microseconds, the floor every new leader sets).
	TokenFloor uint64
	// NoClockFloor leaves the wall clock out of the floor, so that a
	// service whose data lives only as long as its process (fencetest)
	// grants 1, 2, 3...
	NoClockFloor bool
}

// Lessor is the leader's lease lifecycle on one node. Its methods are safe
// for concurrent use.
type Lessor struct {
	cfg       Config
	node      Node          // set by Open
	opened    chan struct{} // closed by Open
	deadlines *deadlines
	waiters   waiters
	joins     *joins
	// office is the term in office this node serves, nil while it does
	// not: set when it is ready, taken away when it leaves.
	office atomic.Pointer[office]

	mu     sync.Mutex // the office: guards stop, and office's changes with it
	stop   context.CancelFunc
	closed bool
	bg     sync.WaitGroup

	// beforeReady, when set by a test, runs when a new leader has taken
	// office and is about to serve.
	beforeReady func()
}

// New returns a lessor out of office.
func New(cfg Config) *Lessor {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Lessor{cfg: cfg, opened: make(chan struct{}), deadlines: newDeadlines(), joins: newJoins(), waiters: waiters{m: make(map[string][]chan fsm.Event), tries: make(map[string]*attempts)}}
}

// Open gives the lessor its node. The node's leadership and applied events
// may reach the lessor before: a node elected before Open takes office
// once it is opened. Open must be called once, before any other method
// but Lead and Applied.
func (l *Lessor) Open(n Node) {
	l.node = n
	close(l.opened)
}

// Applied takes in every applied command's transitions, in log order. The
// node calls it without holding the state machine's lock.
func (l *Lessor) Applied(events []fsm.Event, now time.Time) {
	woke := false
	for _, e := range events {
		switch e.Kind {
		case fsm.EventGranted:
			l.deadlines.granted(e.Scope, e.Lease, now)
		case fsm.EventReleased, fsm.EventExpired:
			l.deadlines.ended(e.Scope, e.Lease.Token)
			if l.joins.n.Load() > 0 {
				l.joins.wake()
			}
		}
		woke = l.waiters.notify(e) || woke
	}
	if woke {
		// A waiter's grant is the next holder's critical path: a
		// contended scope's hand-offs are a chain of them. Woken from
		// here, its handler waited about 50 µs for this goroutine to
		// finish the entry's bookkeeping and answer the futures
		// (eda15be:BENCHMARKS.md, "The hand-off's chain"); yielding lets it run
		// first.
		runtime.Gosched()
	}
}

// Restored takes in a state that replaced the node's from a snapshot (on a
// follower, installed from the leader): every held lease is tracked anew,
// and those that ended meanwhile, whose events this node never had, are
// forgotten. The node calls it on the goroutine that applies commands, so
// no event comes between. A leader gives every lease a full TTL anyway
// when it takes office.
func (l *Lessor) Restored(st *fsm.State, now time.Time) {
	l.deadlines.reset(st.HeldCount(), st.Leases(), now)
}

// Left reports the time left of the lease with this token, 0 if this node
// does not track it (it is not the leader, or the lease's expiry has been
// decided).
func (l *Lessor) Left(scope string, token uint64, now time.Time) time.Duration {
	return l.deadlines.left(scope, token, now)
}
