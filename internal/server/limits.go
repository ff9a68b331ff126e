package server

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/fsm"
)

// minRequestLimit is the least an RPC's request may be, in bytes: a
// request of one item (an Acquire, a Get) is read whole up to it, so that
// one with a field far too long (a 60,000-byte scope) is refused naming
// that field rather than for its size. Decoding 64 KiB costs microseconds.
const minRequestLimit = 64 << 10

// requestLimit is the most a request for procedure (an RPC's path) may be,
// in bytes, as sent and once inflated: a batch RPC's item limit times its
// largest item (see largestRequests), at least minRequestLimit.
func requestLimit(procedure string) int64 {
	return max(batchLimits()[procedure], minRequestLimit)
}

// requestLimits caps each RPC's request at requestLimit while Connect
// reads, inflates and decodes it, not after: a batch of 524,280 empty
// items, 1 MiB of protobuf, took 150 ms of CPU and 50 MB to decode before
// its handler refused it for its count. A request over its limit is
// answered resource_exhausted, and guardBodies makes that 413.
func requestLimits() connect.HandlerOption {
	return connect.WithConditionalHandlerOptions(func(spec connect.Spec) []connect.HandlerOption {
		limit := requestLimit(spec.Procedure)
		return []connect.HandlerOption{connect.WithReadMaxBytes(int(limit)), boundedGzip(limit)}
	})
}

// batchLimits is the size of each batch RPC's largest request: the larger
// of its protobuf and its compact JSON (protojson's, with the longer
// protobuf field names and every field written out).
var batchLimits = sync.OnceValue(func() map[string]int64 {
	limits := make(map[string]int64)
	binary, text := largestRequests(true), largestRequests(false)
	for procedure, m := range binary {
		j, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(text[procedure])
		if err != nil {
			panic(err) // the messages are built below, valid
		}
		limits[procedure] = int64(max(proto.Size(m), len(j)))
	}
	return limits
})

// largestRequests builds each batch RPC's largest request: as many items
// as its handler takes, each with the longest value of every field, as
// the holder or lease ID limits, a duration or time with the most digits,
// the greatest integers. Its flags are flag: true writes them in protobuf,
// false ("false") is the longer in JSON. Strings are of plain ASCII: a JSON
// request that writes its strings with escapes can be larger, and is
// refused for its size, which names the limit.
func largestRequests(flag bool) map[string]proto.Message {
	str := func(n int) string { return strings.Repeat("x", n) }
	scope, leaseID := str(fence.MaxScopeLen), str(32)
	ttl := &durationpb.Duration{Seconds: -315576000000, Nanos: -999999999}
	at := &timestamppb.Timestamp{Seconds: -62135596800, Nanos: 999999999}
	acquires := &fencev1.AcquireBatchRequest{}
	for range maxBatch {
		acquires.Acquires = append(acquires.Acquires, &fencev1.AcquireRequest{Scope: scope, Holder: str(fence.MaxHolderLen),
			Ttl: ttl, Wait: flag, RequestId: str(fsm.MaxRequestIDLen)})
	}
	renewals := &fencev1.RenewBatchRequest{Leases: flag}
	for range maxRenewBatch {
		renewals.Renewals = append(renewals.Renewals, &fencev1.RenewRequest{Scope: scope, LeaseId: leaseID})
	}
	releases := &fencev1.ReleaseBatchRequest{}
	for range maxBatch {
		releases.Releases = append(releases.Releases, &fencev1.ReleaseRequest{Scope: scope, LeaseId: leaseID})
	}
	report := &fencev1.ReportRejectionsRequest{Guard: str(maxGuardName), Dropped: math.MaxUint64}
	for range maxReport {
		report.Rejections = append(report.Rejections, &fencev1.Rejection{Scope: scope,
			PresentedToken: math.MaxUint64, HighestToken: math.MaxUint64, Time: at})
	}
	return map[string]proto.Message{
		fencev1connect.LeaseServiceAcquireBatchProcedure:     acquires,
		fencev1connect.LeaseServiceRenewBatchProcedure:       renewals,
		fencev1connect.LeaseServiceReleaseBatchProcedure:     releases,
		fencev1connect.LeaseServiceReportRejectionsProcedure: report,
	}
}

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
// the limits themselves are Connect's ReadMaxBytes (limit of the request's
// path, which requestLimits gives each RPC) and the server's ReadTimeout,
// which ends the reading of a body (over HTTP/2, of one stream's) that
// takes too long.
//
//   - A body larger than its limit is answered 413 Content Too Large. Connect
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
func guardBodies(limit func(path string) int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := &guardedBody{ReadCloser: r.Body}
		r.Body = b
		gw := &guardedWriter{ResponseWriter: w, body: b, max: limit(r.URL.Path), compressed: r.Header.Get("Content-Encoding") != ""}
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
