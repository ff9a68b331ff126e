package server

import (
	"net/http"
	"time"
)

// cutSlowReaders gives every write of an answer d to complete: a client
// that stops reading (a stalled watcher, a slowloris) has its stream reset
// once a write waits longer than that, instead of holding a goroutine and
// its buffers for ever. The deadline covers a write only while it is under
// way (an HTTP/2 stream is reset when its deadline passes, even idle), so a
// watch that is quiet for hours is left alone.
//
// Over HTTP/2 the last bytes of an answer (all of a small one) wait in a
// buffer that the server sends once the handler has returned, with no
// deadline, for as long as the client gives no flow-control window: they
// are sent here instead, under the same deadline. Over HTTP/1.1 the
// server writes them at once, and an early flush would cost the answer
// its Content-Length.
func cutSlowReaders(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: d}
		next.ServeHTTP(dw, r)
		if r.ProtoMajor == 2 {
			dw.Flush()
		}
	})
}

type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	w.rc.SetWriteDeadline(time.Now().Add(w.d))
	defer w.rc.SetWriteDeadline(time.Time{})
	return w.ResponseWriter.Write(b)
}

func (w *deadlineWriter) Flush() {
	w.rc.SetWriteDeadline(time.Now().Add(w.d))
	defer w.rc.SetWriteDeadline(time.Time{})
	w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the real writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
