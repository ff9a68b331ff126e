package server

import (
	"errors"
	"io"
	"net/http"
	"os"
	"sync/atomic"
)

// guardBodies answers for request bodies that are too large or too slow;
// the limits themselves are Connect's ReadMaxBytes and the server's
// ReadTimeout, which ends the reading of a body (over HTTP/2, of one
// stream's) that takes too long.
//
//   - A body larger than max is answered 413 Content Too Large. Connect
//     answers it resource_exhausted, which its protocol sends as 429 Too
//     Many Requests: a status clients and proxies retry, though the same
//     request can never succeed. (gRPC answers in the trailers; those stay.)
//   - A request whose body timed out closes its connection once answered
//     (over HTTP/2 the server sends GOAWAY and closes the connection when
//     its streams are done): a client that sends a byte a second does not
//     keep the connection to start more such requests.
//
// A body read whole before its deadline, as every valid request's is (a
// watch's too, however long it then lasts), is not affected. A follower
// forwarding the request reads the body in another goroutine than the one
// answering: hence the atomics.
func guardBodies(max int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := &guardedBody{ReadCloser: r.Body}
		r.Body = b
		next.ServeHTTP(&guardedWriter{ResponseWriter: w, body: b, max: max}, r)
	})
}

type guardedBody struct {
	io.ReadCloser
	n        atomic.Int64 // bytes read
	timedOut atomic.Bool
}

func (b *guardedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		b.timedOut.Store(true)
	}
	return n, err
}

type guardedWriter struct {
	http.ResponseWriter
	body  *guardedBody
	max   int64
	wrote bool
}

func (w *guardedWriter) WriteHeader(code int) {
	if !w.wrote {
		w.wrote = true
		if code == http.StatusTooManyRequests && w.body.n.Load() > w.max {
			code = http.StatusRequestEntityTooLarge
		}
		if w.body.timedOut.Load() {
			w.Header().Set("Connection", "close")
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write and Flush send the header if no WriteHeader did, as WriteHeader
// would.
func (w *guardedWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *guardedWriter) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the real writer.
func (w *guardedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
