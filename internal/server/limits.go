package server

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"

	"connectrpc.com/connect"
)

// boundedGzip replaces connect-go's gzip for requests with one that stops
// inflating a message at max+1 bytes. Connect caps the compressed bytes it
// reads and what it keeps of the inflated message at ReadMaxBytes, but to
// name the size of a message over the limit it inflates the rest into
// io.Discard (connect-go 1.21 compressionPool.Decompress): a 1 MB body of
// zeros inflating to 1,000 MiB cost a quarter of a second of CPU, before
// authentication. A message that inflates beyond max is answered
// resource_exhausted, and guardBodies makes that 413. Answers are
// compressed as connect-go's own gzip does.
func boundedGzip(max int64) connect.HandlerOption {
	return connect.WithCompression("gzip",
		func() connect.Decompressor { return &boundedGzipReader{max: max} },
		func() connect.Compressor { return gzip.NewWriter(io.Discard) },
	)
}

// inflatedTooLarge is in the error a message that inflates beyond the
// limit is answered with; guardBodies looks for it to answer 413.
const inflatedTooLarge = "inflates beyond the request limit of"

// boundedGzipReader is a gzip reader that fails once it has produced more
// than max bytes. It is not safe for concurrent use; connect-go pools it.
type boundedGzipReader struct {
	gz  gzip.Reader
	max int64
	n   int64 // bytes produced since Reset
}

func (r *boundedGzipReader) Read(p []byte) (int, error) {
	if r.n > r.max {
		return 0, fmt.Errorf("the message %s %d bytes", inflatedTooLarge, r.max)
	}
	if left := r.max + 1 - r.n; int64(len(p)) > left {
		p = p[:left]
	}
	n, err := r.gz.Read(p)
	r.n += int64(n)
	return n, err
}

func (r *boundedGzipReader) Reset(src io.Reader) error {
	r.n = 0
	return r.gz.Reset(src)
}

func (r *boundedGzipReader) Close() error { return r.gz.Close() }

// guardBodies answers for request bodies that are too large or too slow;
// the limits themselves are Connect's ReadMaxBytes and the server's
// ReadTimeout, which ends the reading of a body (over HTTP/2, of one
// stream's) that takes too long.
//
//   - A body larger than max is answered 413 Content Too Large. Connect
//     answers it resource_exhausted, which its protocol sends as 429 Too
//     Many Requests: a status clients and proxies retry, though the same
//     request can never succeed. (gRPC answers in the trailers; those stay.)
//     So is a compressed body that inflates beyond max (boundedGzip): its
//     429 is held back until its error is written, which names the cause.
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
		gw := &guardedWriter{ResponseWriter: w, body: b, max: max, compressed: r.Header.Get("Content-Encoding") != ""}
		next.ServeHTTP(gw, r)
		gw.sendHeld(nil)
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
	// compressed: the request is a Connect unary one with a compressed
	// body (Content-Encoding), whose 429 may be one of an inflated body
	// over the limit; held: such a 429, not sent until its error is.
	compressed bool
	held       bool
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
		if code == http.StatusTooManyRequests && w.compressed {
			w.held = true
			return
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

// sendHeld sends a held 429, as 413 if the error that follows it, first,
// says the body inflated beyond the limit.
func (w *guardedWriter) sendHeld(first []byte) {
	if !w.held {
		return
	}
	w.held = false
	code := http.StatusTooManyRequests
	if bytes.Contains(first, []byte(inflatedTooLarge)) {
		code = http.StatusRequestEntityTooLarge
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write and Flush send the header if no WriteHeader did, as WriteHeader
// would.
func (w *guardedWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.sendHeld(b)
	return w.ResponseWriter.Write(b)
}

func (w *guardedWriter) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.sendHeld(nil)
	http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the real writer.
func (w *guardedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
