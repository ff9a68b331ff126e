package lessor

import (
	"context"
	"fmt"
	"time"

	"github.com/fence-dev/fence/internal/fsm"
)

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
	if _, err := l.submit(bctx, fsm.Command{Op: fsm.OpPromote, At: now.UnixNano(), Token: floor}); err != nil {
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
