package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/fence-dev/fence/internal/fsm"
)

// maxQueuedLines bounds the event lines waiting to be written; past it the
// state machine waits, as it did when it wrote them itself.
const maxQueuedLines = 4096

// eventLines writes the log line of each lease event from a goroutine of
// its own. The events come from the goroutine that applies the Raft log,
// and every caller in a batch waits until that goroutine is done with the
// batch's entry: a line costs about 2 µs to format, some 50 µs of a busy
// leader's 25-grant batch (eda15be:BENCHMARKS.md). The lines keep their order
// and the time their event was applied.
type eventLines struct {
	log  *slog.Logger
	ch   chan eventLine
	done chan struct{}
}

type eventLine struct {
	at    time.Time
	level slog.Level
	e     fsm.Event
}

func newEventLines(log *slog.Logger) *eventLines {
	l := &eventLines{log: log, ch: make(chan eventLine, maxQueuedLines), done: make(chan struct{})}
	go l.run()
	return l
}

// add queues e's line, unless its level is not logged.
func (l *eventLines) add(at time.Time, e fsm.Event) {
	level := slog.LevelInfo
	if e.Kind == fsm.EventCancelled {
		level = slog.LevelDebug
	}
	if l.log.Enabled(context.Background(), level) {
		l.ch <- eventLine{at, level, e}
	}
}

func (l *eventLines) run() {
	defer close(l.done)
	h := l.log.Handler()
	for line := range l.ch {
		e := line.e
		r := slog.NewRecord(line.at, line.level, "lease "+e.Kind.String(), 0)
		r.AddAttrs(
			slog.String("scope", e.Scope),
			slog.Uint64("token", e.Lease.Token),
			slog.String("lease", e.Lease.ID.Fingerprint()),
			slog.String("holder", e.Lease.Holder),
			slog.Duration("ttl", e.Lease.TTL),
		)
		if e.Closing != 0 {
			r.AddAttrs(slog.Uint64("closing_token", e.Closing))
		}
		h.Handle(context.Background(), r) // a failed write has nowhere to be reported
	}
}

// Close writes the queued lines and stops. No line may be added after it.
func (l *eventLines) Close() {
	close(l.ch)
	<-l.done
}
