package main

import (
	"io"
	"sync"
)

// maxQueuedLog bounds the log bytes that wait for the writer; past it a
// Write waits, as a direct write to a slow stderr would.
const maxQueuedLog = 1 << 20

// logWriter hands fenced's log lines to stderr from a goroutine of its
// own. fenced logs every lease transition on the goroutine that applies
// the Raft log, and a write system call per line took a tenth of a busy
// node's CPU and held up the next entry (the benchmark notes in
// eda15be:BENCHMARKS.md). Here the lines
// queue in memory and go out in order, together, as soon as the writer is
// free: nothing waits on a timer. Close writes what is queued; a process
// killed outright loses what had not gone out yet, a few lines at most.
type logWriter struct {
	out io.Writer

	mu      sync.Mutex
	cond    sync.Cond // signalled when lines are queued, written or closed
	queued  []byte
	closed  bool
	drained chan struct{} // closed by run once Close's lines are written
}

func newLogWriter(out io.Writer) *logWriter {
	w := &logWriter{out: out, drained: make(chan struct{})}
	w.cond.L = &w.mu
	go w.run()
	return w
}

// Write queues p. It never fails: a failed write to stderr has nowhere to
// be reported.
func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.queued) >= maxQueuedLog && !w.closed {
		w.cond.Wait()
	}
	if w.closed {
		return w.out.Write(p) // after Close, as it comes
	}
	w.queued = append(w.queued, p...)
	w.cond.Broadcast()
	return len(p), nil
}

func (w *logWriter) run() {
	var batch []byte
	for {
		w.mu.Lock()
		for len(w.queued) == 0 && !w.closed {
			w.cond.Wait()
		}
		if len(w.queued) == 0 { // closed and drained
			w.mu.Unlock()
			close(w.drained)
			return
		}
		batch, w.queued = w.queued, batch[:0]
		w.cond.Broadcast() // room for writers waiting on a full queue
		w.mu.Unlock()
		w.out.Write(batch)
	}
}

// Close writes the queued lines and waits until they are out. Lines
// logged after it are written at once.
func (w *logWriter) Close() {
	w.mu.Lock()
	w.closed = true
	w.cond.Broadcast()
	w.mu.Unlock()
	<-w.drained
}
