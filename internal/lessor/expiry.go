package lessor

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/fence-dev/fence/internal/fsm"
)

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
	_, err := l.submit(actx, fsm.Command{Op: fsm.OpExpireMany, Expiries: es, At: time.Now().UnixNano()})
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
