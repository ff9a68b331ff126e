// Package lessor is the leader's side of the lease lifecycle: it takes and
// leaves office, keeps every held lease's deadline, expires the leases whose
// deadline passes by proposing their expiry, and answers acquires (waiting
// in line included), renewals and releases. It knows nothing of RPCs,
// authorization or events shown to people: the server wires it to those.
//
// # Renewals
//
// RenewBatch moves deadlines and then, if it renewed any, confirms that the
// node still leads (Node.ConfirmLeader) before it returns: an error means
// no renewal of the batch may be confirmed to its holder. The rule lives
// here so that no RPC path can skip it.
//
// # A waiting acquire's life
//
// Every acquire with wait goes through these states, in this order, and
// leaves by one of the answers named (Acquire, wait, carry, inLine):
//
//  1. Admitted: Config.Admit counts it against its owner until answered.
//  2. Listening: registered under its wait key (request ID, else lease
//     ID), before anything is proposed, since the grant may be applied
//     before the proposal returns.
//  3. Parked (joins): in office, from fsm.WaitBatchFormat on, it waits on
//     the leader, behind the earlier waiting acquires of its scope, for an
//     entry to carry it: the next one proposed while none that carries
//     acquires of its scope is on its way (so that the log has them in
//     the order they came), one its own caller proposes at once if its
//     scope is free and nothing of its scope is parked or on its way, or
//     the flusher's once its scope frees or after maxPark. Out of office,
//     or below that format, it skips this state and is proposed alone.
//     Leaves: its caller gives up (context error, nothing proposed); the
//     office ends (leader changed).
//  4. Carried: in an entry on its way. Leaves with the entry's result for
//     it (granted, held, refused: answered as such; queued: on to 5) or its
//     error (outcome unknown: the caller retries with its request ID).
//  5. In line: in the state machine's line, for as long as the office that
//     answered it queued lasts. Leaves: its grant (granted); its removal by
//     a new leader's promote (leader changed); the end of the office
//     (leader changed: a leader deposed and cut off never applies the next
//     one's promote, and its waiter must not hang; the line is not
//     withdrawn, the next promote drops it and a retry with the same
//     request ID finds its place if it outlived the office); its caller
//     gives up (it proposes its own withdrawal, unless another attempt of
//     the same request ID waits in that place or was answered with its
//     grant).
//
// "Leader changed" is fence.ErrUnavailable: the client retries at the next
// leader.
//
// # Lock order
//
// Three locks meet here; whoever holds one of them takes only the ones
// below it:
//
//  1. Lessor.mu, the office: taking office begins it under it, leaving
//     office ends it and cancels its work under it.
//  2. joins.mu, the parked waiting acquires.
//  3. The state machine's lock, held by Node.Read and by the writer that
//     applies commands.
//  4. deadlines.mu, and waiters.mu beside it (never both at once).
//
// The state machine's writer takes 3 and then, after releasing it, 4
// (Applied). sync.RWMutex holds new readers back behind a waiting writer, so
// a reader that held 4 and then asked for 3 would close a cycle with it.
package lessor

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fence-dev/fence"
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

// office is one term in office, from the moment the node serves until it
// leaves. The waiters in line that it answered queued wait no longer than
// it lasts.
type office struct {
	left chan struct{} // closed when the node leaves office
}

// Ready reports whether this node is leader, has taken office, and serves.
func (l *Lessor) Ready() bool { return l.office.Load() != nil }

// Lead runs on leadership changes. A new leader first applies its whole
// log (Barrier), then gives every held lease a full TTL, then drops the
// waiters of the previous term, and only then serves and expires.
func (l *Lessor) Lead(leader bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leaveLocked()
	if !leader {
		l.cfg.Logger.Info("lost leadership")
		return
	}
	if l.closed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.stop = cancel
	l.bg.Add(1)
	go func() {
		defer l.bg.Done()
		select {
		case <-l.opened:
		case <-ctx.Done():
			return
		}
		for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
			err := l.takeOffice(ctx)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			l.cfg.Logger.Error("taking office as leader; will retry", "err", err, "retry_in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
		}
		l.bg.Go(func() { l.flushLoop(ctx) })
		l.expireLoop(ctx)
	}()
}

// Stop leaves office for good. It does not wait for the office's work to
// end: a proposal in flight ends only when the node answers it, which may
// take until the node is closed. Wait waits for it.
func (l *Lessor) Stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.leaveLocked()
}

// Wait returns once the work of every office has ended: after Stop, and
// after closing the node, so that no proposal is left waiting.
func (l *Lessor) Wait() { l.bg.Wait() }

// leaveLocked ends the office and cancels its work together, under l.mu,
// where takeOffice checks its context and begins the office: an office
// cancelled before it begins never does. Every waiter of the office, parked
// or in line, is answered "leader changed".
func (l *Lessor) leaveLocked() {
	if o := l.office.Swap(nil); o != nil {
		close(o.left)
	}
	l.joins.leave()
	if l.stop != nil {
		l.stop()
		l.stop = nil
	}
}

func (l *Lessor) takeOffice(ctx context.Context) error {
	bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	node := l.node
	if err := node.Barrier(bctx); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	// The token floor needs the log format that knows it. A lone node,
	// or a cluster whose members all run this build, raises it here, so
	// that this term's first grant already comes after the floor; a member
	// that runs an older build leaves it to the raise that keeps trying.
	fctx, fcancel := context.WithTimeout(bctx, 10*time.Second)
	if err := node.RaiseFormat(fctx); err != nil {
		l.cfg.Logger.Debug("taking office under the older log format", "err", err)
	}
	fcancel()
	held, format := 0, 0
	node.Read(func(st *fsm.State) {
		held, format = st.HeldCount(), st.Format()
		l.deadlines.reset(held, st.Leases(), time.Now())
	})
	now := time.Now()
	floor := l.cfg.TokenFloor
	if !l.cfg.NoClockFloor {
		floor = max(floor, uint64(max(now.UnixMicro(), 0)))
	}
	if _, err := node.Apply(bctx, fsm.Command{Op: fsm.OpPromote, At: now.UnixNano(), Token: floor}); err != nil {
		return fmt.Errorf("promote: %w", err)
	}
	if format < fsm.FloorFormat {
		l.cfg.Logger.Warn("taking office without a token floor: a member runs a build older than log format 7, so a node that lost the end of its log could issue its tokens again; upgrade every node",
			"log_format", format)
		floor = 0
	}
	if l.cfg.TakeOffice != nil {
		if err := l.cfg.TakeOffice(bctx); err != nil {
			return err
		}
	}
	if l.beforeReady != nil {
		l.beforeReady()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	l.enterLocked()
	l.cfg.Logger.Info("leader ready", "held_leases", held, "token_floor", floor)
	return nil
}

// enterLocked begins an office: the node serves.
func (l *Lessor) enterLocked() {
	l.joins.enter()
	l.office.Store(&office{left: make(chan struct{})})
}

// expireLoop proposes the expiry of every lease whose deadline passes,
// until ctx is done: up to fsm.MaxExpireMany leases in one command and a
// few commands at a time, so that leases ending together cost few log
// entries (100,000 of them, about a hundred).
func (l *Lessor) expireLoop(ctx context.Context) {
	const inFlight = 4
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		due, next := l.deadlines.due(time.Now(), inFlight*fsm.MaxExpireMany)
		var wg sync.WaitGroup
		for batch := range slices.Chunk(due, fsm.MaxExpireMany) {
			wg.Go(func() { l.expire(ctx, batch) })
		}
		wg.Wait()
		if len(due) == inFlight*fsm.MaxExpireMany {
			continue
		}
		wait := time.Second
		if !next.IsZero() {
			wait = min(time.Until(next), wait)
		}
		timer.Reset(max(wait, 0))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-l.deadlines.wake:
		}
	}
}

func (l *Lessor) expire(ctx context.Context, due []deadline) {
	es := make([]fsm.Expiry, len(due))
	for i, d := range due {
		es[i] = fsm.Expiry{Scope: d.scope, Token: d.token}
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := l.node.Apply(actx, fsm.Command{Op: fsm.OpExpireMany, Expiries: es, At: time.Now().UnixNano()})
	if err != nil {
		if ctx.Err() == nil {
			l.cfg.Logger.Warn("expire failed; will retry", "leases", len(due), "first_scope", due[0].scope, "first_token", due[0].token, "err", err)
		}
		at := time.Now().Add(100 * time.Millisecond)
		for _, d := range due {
			l.deadlines.retry(d.scope, d.token, at)
		}
	}
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

// Acquire proposes an acquire command, stamped and validated by the caller,
// and, if it waits, follows it through its life (see the package doc) until
// it is granted, refused, or ctx is done, in which case it withdraws from
// the line. The result's outcome is the command's, or Granted after a wait.
func (l *Lessor) Acquire(ctx context.Context, c fsm.Command) (fsm.Result, error) {
	done, err := l.admit(c)
	if err != nil {
		return fsm.Result{}, err
	}
	defer done()
	if !c.Wait {
		return l.proposeOne(ctx, c)
	}
	return l.wait(ctx, c)
}

// wait is the life of a waiting acquire.
func (l *Lessor) wait(ctx context.Context, c fsm.Command) (fsm.Result, error) {
	// Listen before proposing: the grant may be applied before Apply
	// returns to us.
	key := waitKey(c.Scope, fsm.Lease{ID: c.LeaseID, RequestID: c.RequestID})
	grant, err := l.waiters.add(ctx, key)
	if err != nil {
		return fsm.Result{}, fmt.Errorf("acquire %q: %w", c.Scope, err)
	}
	defer l.waiters.remove(key, grant)
	r, err := l.carry(ctx, c)
	if err != nil {
		return r, err
	}
	if r.Outcome == fsm.Queued {
		// The office that answered it queued: its line is this office's,
		// and no longer than it lasts. With none, the next office's
		// promote drops it.
		o := l.office.Load()
		if o == nil {
			return fsm.Result{}, leaderChanged(c.Scope)
		}
		done := func(bool) {}
		if l.cfg.Queued != nil {
			done = l.cfg.Queued()
		}
		r, err = l.inLine(ctx, key, r, grant, o)
		done(err == nil)
	}
	if r.Outcome == fsm.Granted {
		l.waiters.answered(key)
	}
	return r, err
}

// carry brings a waiting acquire into an entry and returns its result
// there: parked until an entry carries it (see joins), or proposed now.
func (l *Lessor) carry(ctx context.Context, c fsm.Command) (fsm.Result, error) {
	j, now := l.joins.park(l.node, c, time.Now())
	if j == nil {
		return l.proposeOne(ctx, c)
	}
	if now {
		// Its scope is free: propose now, carrying it behind whatever
		// parked before it. If this entry fails, j is answered with its
		// error; if another entry took j first, that one answers it.
		l.propose(ctx, nil)
	}
	select {
	case a := <-j.done:
		return a.r, a.err
	case <-ctx.Done():
	}
	if l.joins.unpark(j) {
		return fsm.Result{}, fmt.Errorf("wait for %q: %w", c.Scope, ctx.Err())
	}
	// An entry carries it: its answer is on its way, and a place in line
	// is withdrawn as any other.
	a := <-j.done
	return a.r, a.err
}

// flushLoop proposes the parked acquires that must not wait for another
// entry to carry them, until ctx is done.
func (l *Lessor) flushLoop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.joins.kick:
		case <-timer.C:
		}
		due, next := l.joins.due(l.node, time.Now())
		if due {
			// The acquires it fails are answered with its error.
			if _, err := l.propose(ctx, nil); err != nil && ctx.Err() == nil {
				l.cfg.Logger.Warn("proposing waiting acquires failed", "err", err)
			}
			next = time.Now() // look again at once
		}
		if next.IsZero() {
			next = time.Now().Add(time.Hour) // nothing parked: a park wakes it
		}
		timer.Reset(time.Until(next))
	}
}

// inLine waits in the state machine's line until the queued acquire is
// granted, the office o ends or the line is dropped (a promote), both
// answered "leader changed", or its caller gives up, in which case it
// withdraws from the line, unless another attempt with the same request ID
// uses that place or its grant.
func (l *Lessor) inLine(ctx context.Context, key string, queued fsm.Result, grant chan fsm.Event, o *office) (fsm.Result, error) {
	granted := func(e fsm.Event) (fsm.Result, error) {
		if e.Kind == fsm.EventGranted {
			return fsm.Result{Outcome: fsm.Granted, Scope: e.Scope, Lease: e.Lease}, nil
		}
		return fsm.Result{}, leaderChanged(queued.Scope)
	}
	select {
	case e := <-grant:
		return granted(e)
	case <-o.left:
		// A grant that came with the end of the office is still one.
		select {
		case e := <-grant:
			return granted(e)
		default:
		}
		// Not withdrawn: a deposed leader cannot, and the next
		// leader's promote drops the line; a retry with the same
		// request ID finds this place if the line outlived the office.
		return fsm.Result{}, leaderChanged(queued.Scope)
	case <-ctx.Done():
	}
	if !l.waiters.abandon(key) {
		return fsm.Result{}, fmt.Errorf("wait for %q: %w", queued.Scope, ctx.Err())
	}
	defer l.waiters.withdrawn(key)
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := l.node.Apply(cctx, fsm.Command{Op: fsm.OpCancel, Scope: queued.Scope, LeaseID: queued.Lease.ID, At: time.Now().UnixNano()})
	if err != nil {
		l.cfg.Logger.Warn("withdrawing a waiter failed", "scope", queued.Scope, "lease", queued.Lease.ID.Fingerprint(), "err", err)
	}
	return fsm.Result{}, fmt.Errorf("wait for %q: %w", queued.Scope, ctx.Err())
}

// Renewal names a lease to renew.
type Renewal struct {
	Scope string
	ID    fence.LeaseID
}

// Renewed is what RenewBatch decides for one lease: the lease as checked
// (or why not), and its TTL if renewed.
type Renewed struct {
	fsm.Result
	TTL time.Duration
}

// renewChunk bounds the renewals made under one hold of the locks, so that
// a large batch does not hold the state machine's writer back for long.
const renewChunk = 128

// RenewBatch moves each lease's deadline a full TTL ahead if its ID is the
// scope's current lease and its expiry has not been decided, taking the
// locks once for many of them, and answers rs[i] in out[i] (out is as long
// as rs; the caller's, so that it can reuse it). If it renewed any, it then
// confirms that this node still leads (Node.ConfirmLeader) and returns its
// error if it cannot: then none of the renewals may be confirmed to its
// holder, since a new leader counts the TTL from its own start, not from
// this renewal. A refusal in out stands either way.
func (l *Lessor) RenewBatch(ctx context.Context, rs []Renewal, out []Renewed) error {
	renewed := false
	for start := 0; start < len(rs); start += renewChunk {
		end := min(start+renewChunk, len(rs))
		// The state lock first, then the deadlines': see the lock order.
		l.node.Read(func(st *fsm.State) {
			renewed = l.deadlines.renew(time.Now(), rs[start:end], out[start:end], func(r Renewal) fsm.Result { return st.Check(r.Scope, r.ID) }) || renewed
		})
	}
	if !renewed {
		return nil
	}
	return l.node.ConfirmLeader(ctx)
}

// Batch proposes acquires without wait and releases, stamped and validated
// by the caller, and returns their results in the order of cs. Once the
// cluster's log format has fsm.OpBatch they are one log entry; before, one
// entry each, in order, so they apply as the batch would. An error means
// the outcome of every command is unknown.
func (l *Lessor) Batch(ctx context.Context, cs []fsm.Command) ([]fsm.Result, error) {
	// An acquire Admit refuses is answered Invalid with Admit's error, and
	// the others are proposed without it.
	out := make([]fsm.Result, len(cs))
	admitted := make([]fsm.Command, 0, len(cs))
	at := make([]int, 0, len(cs)) // admitted[j] is cs[at[j]]
	var dones []func()
	defer func() {
		for _, done := range dones {
			done()
		}
	}()
	for i, c := range cs {
		if c.Op == fsm.OpAcquire {
			done, err := l.admit(c)
			if err != nil {
				out[i] = fsm.Result{Outcome: fsm.Invalid, Scope: c.Scope, Err: err}
				continue
			}
			dones = append(dones, done)
		}
		admitted = append(admitted, c)
		at = append(at, i)
	}
	rs, err := l.propose(ctx, admitted)
	if err != nil {
		return nil, err
	}
	for j, r := range rs {
		out[at[j]] = r
	}
	return out, nil
}

// admit asks Config.Admit about an acquire.
func (l *Lessor) admit(c fsm.Command) (done func(), err error) {
	if l.cfg.Admit == nil {
		return func() {}, nil
	}
	return l.cfg.Admit(c)
}

// proposeOne proposes one command, with the parked acquires.
func (l *Lessor) proposeOne(ctx context.Context, c fsm.Command) (fsm.Result, error) {
	rs, err := l.propose(ctx, []fsm.Command{c})
	if err != nil {
		return fsm.Result{}, err
	}
	return rs[0], nil
}

// propose applies a batch's commands after the parked acquires it takes
// along, as one log entry if the format allows, and returns the results
// of cs.
func (l *Lessor) propose(ctx context.Context, cs []fsm.Command) ([]fsm.Result, error) {
	format := 0
	l.node.Read(func(st *fsm.State) { format = st.Format() })
	var taken []*join
	if format >= fsm.WaitBatchFormat {
		taken = l.joins.take(fsm.MaxBatch - len(cs))
	}
	if len(taken) == 0 {
		return l.apply(ctx, cs, format)
	}
	all := make([]fsm.Command, 0, len(taken)+len(cs))
	for _, j := range taken {
		all = append(all, j.c)
	}
	rs, err := l.apply(ctx, append(all, cs...), format)
	l.joins.answer(taken, rs, err)
	if err != nil {
		return nil, err
	}
	return rs[len(taken):], nil
}

// apply applies cs, as one log entry if the format allows.
func (l *Lessor) apply(ctx context.Context, cs []fsm.Command, format int) ([]fsm.Result, error) {
	if len(cs) == 0 {
		return nil, nil
	}
	if len(cs) > 1 && format >= fsm.BatchFormat {
		r, err := l.node.Apply(ctx, fsm.Command{Op: fsm.OpBatch, Commands: cs})
		if err != nil {
			return nil, err
		}
		if len(r.Results) != len(cs) {
			// The whole batch refused: a caller's bug, never a replica's.
			return nil, fmt.Errorf("batch of %d: %v: %w", len(cs), r.Outcome, r.Err)
		}
		return r.Results, nil
	}
	out := make([]fsm.Result, len(cs))
	for i, c := range cs {
		r, err := l.node.Apply(ctx, c)
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

// Release proposes the release of the scope's lease with this ID.
func (l *Lessor) Release(ctx context.Context, scope string, id fence.LeaseID) (fsm.Result, error) {
	return l.proposeOne(ctx, fsm.Command{Op: fsm.OpRelease, Scope: scope, LeaseID: id, At: time.Now().UnixNano()})
}

// Left reports the time left of the lease with this token, 0 if this node
// does not track it (it is not the leader, or the lease's expiry has been
// decided).
func (l *Lessor) Left(scope string, token uint64, now time.Time) time.Duration {
	return l.deadlines.left(scope, token, now)
}

// waiters connects queued acquires to the grant that ends their wait, and
// keeps the attempts of one request ID from undoing each other: the first
// may be abandoned by its caller while its retry waits in the same place
// in line, or has been answered with the same grant.
type waiters struct {
	mu    sync.Mutex
	m     map[string][]chan fsm.Event
	tries map[string]*attempts
}

// attempts are the waiting acquires in flight under one wait key.
type attempts struct {
	n        int  // in flight
	answered bool // one was answered with the grant
	// withdrawing is closed when an abandoned attempt's withdrawal is
	// applied; until then a new attempt waits, so that it is ordered
	// after the withdrawal rather than withdrawn by it.
	withdrawing chan struct{}
}

// waitKey identifies a queued acquire: by request ID when it has one, so a
// retry finds the grant of its first attempt, else by lease ID.
func waitKey(scope string, l fsm.Lease) string {
	if l.RequestID != "" {
		return "r\x00" + scope + "\x00" + l.RequestID
	}
	return "i\x00" + l.ID.String()
}

func (w *waiters) add(ctx context.Context, key string) (chan fsm.Event, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		a := w.tries[key]
		if a == nil {
			a = &attempts{}
			w.tries[key] = a
		}
		if a.withdrawing == nil {
			a.n++
			ch := make(chan fsm.Event, 1)
			w.m[key] = append(w.m[key], ch)
			return ch, nil
		}
		withdrawing := a.withdrawing
		w.mu.Unlock()
		select {
		case <-withdrawing:
		case <-ctx.Done():
			w.mu.Lock()
			return nil, ctx.Err()
		}
		w.mu.Lock()
	}
}

// answered records that an attempt was answered with the grant: abandoning
// another attempt of the same key must then not release it.
func (w *waiters) answered(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if a := w.tries[key]; a != nil {
		a.answered = true
	}
}

// abandon reports whether the attempt under key, whose caller gave up, may
// withdraw its place in line (or release the grant that just reached it):
// only if it is the one attempt in flight and none was answered. If so,
// new attempts wait until withdrawn is called.
func (w *waiters) abandon(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	a := w.tries[key]
	if a == nil || a.n > 1 || a.answered {
		return false
	}
	a.withdrawing = make(chan struct{})
	return true
}

// withdrawn ends what abandon began.
func (w *waiters) withdrawn(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if a := w.tries[key]; a != nil && a.withdrawing != nil {
		close(a.withdrawing)
		a.withdrawing = nil
	}
}

func (w *waiters) remove(key string, ch chan fsm.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if a := w.tries[key]; a != nil {
		if a.n--; a.n <= 0 {
			delete(w.tries, key)
		}
	}
	list := w.m[key]
	if i := slices.Index(list, ch); i >= 0 {
		list = slices.Delete(list, i, i+1)
	}
	if len(list) == 0 {
		delete(w.m, key)
	} else {
		w.m[key] = list
	}
}

// notify hands e to the acquires waiting for it, reporting whether any
// took it.
func (w *waiters) notify(e fsm.Event) bool {
	if e.Kind != fsm.EventGranted && e.Kind != fsm.EventCancelled {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	woke := false
	for _, ch := range w.m[waitKey(e.Scope, e.Lease)] {
		select {
		case ch <- e:
			woke = true
		default:
		}
	}
	return woke
}
