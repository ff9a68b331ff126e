package lessor

import (
	"context"
	"slices"
	"sync"

	"github.com/fence-dev/fence/internal/fsm"
)

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
