// Package httpguard enforces fencing tokens on net/http services, and
// presents them from net/http clients.
//
// # Usage
//
// Server side, fence the handlers that write:
//
//	fenced, err := httpguard.Middleware(guard.New(store), "orders")
//	if err != nil {
//		return err
//	}
//	mux.Handle("POST /orders/", fenced(ordersHandler))
//
// A request carries its lease's token in the Fencing-Token header (the
// token's text form, "fence:v1:orders:42") and optionally a sequence number
// in Fencing-Sequence. The middleware reads the request body whole, then
// runs the handler inside the scope's fenced section. A stale token gets
// 409 Conflict, a missing, malformed or foreign token 400 Bad Request, a
// body over the limit (1 MiB, WithMaxBody) 413 Content Too Large, all with
// an RFC 9457 application/problem+json body (scope, presented_token,
// highest_token).
//
// Client side, wrap the transport with the lease:
//
//	hc := &http.Client{Transport: httpguard.NewTransport(lease, nil)}
//
// Each request then carries the lease's token; a 409 stale answer to that
// token marks the lease lost, and later requests fail without being sent.
// A stale answer naming another scope or token (a server passing on the
// refusal of its own write downstream) leaves the lease alone.
//
// # Caveats
//
// Every request the middleware wraps is fenced, whatever its method: a
// GET without a current token is refused like a POST. Handlers that write
// on GET exist, and a read under a stale token can feed a decision the
// newer holder never sees; a route wrapped in the middleware is safe
// whatever its handler does. Wrap only the routes that need the fence, or
// give WithUnfencedReads to let GET, HEAD, OPTIONS and TRACE pass
// unchecked when the handler writes on none of them. A fenced read runs
// in the store's fenced section like a write, and advances the mark like
// one.
//
// A handler that answers an error status (400 or above) has failed: the
// store rolls back the writes it made in the fenced section's transaction
// (boltguard's and sqlguard's TxFromContext), and its answer is sent as it
// wrote it. Its token still becomes the scope's highest (guard.Advance),
// since it was granted and so every older lease is over; its sequence
// number does not, so a retry may present it again. Effects outside the
// store's transaction cannot be rolled back: a store without transactions
// (guard.MemoryStore, redisguard.Store) keeps whatever the handler changed,
// and the advanced mark then at least refuses older writers after it.
//
// The request body is read, whole and up to the limit (DefaultMaxBody,
// WithMaxBody), before the fenced section begins, and the handler reads it
// from memory. A store's fenced section is a write transaction (bbolt's
// and SQLite's take the whole database; PostgreSQL's holds the scope's row
// and a pooled connection): read inside it, a client that sent part of its
// body and stalled held every other scope's writes for the whole stall.
// Reading the body is bounded only by the server: give the http.Server a
// ReadTimeout (net/http has none by default), or a client that stalls keeps
// its goroutine and what it sent of its body for as long as it likes,
// though it no longer holds up anyone else's writes. Slow headers never
// reach the middleware: over HTTP/1 give the server a ReadHeaderTimeout;
// over HTTP/2 net/http has no header deadline, and a trickled header block
// holds its connection until the server's HTTP2Config.SendPingTimeout and
// PingTimeout close it (no pings by default: then the IdleTimeout, or the
// ReadTimeout when that is unset), as docs/security.md describes.
//
// The handler's answer is held back until the fenced section has ended,
// and sent only if the section succeeded: with a store that commits the
// handler's writes together with the mark (boltguard, sqlguard), a commit
// that fails after the handler answered gets a 500 problem instead, and the
// handler's answer is dropped. So a fenced handler cannot stream or flush
// (its ResponseWriter is no http.Flusher), and its whole answer is kept in
// memory.
//
// A store that may run the handler more than once (a guard.Repeater, such
// as boltguard's Batched store, which commits concurrent writes together)
// keeps only the last run's writes, so only the last run's answer is sent,
// and each run reads the request body from its start. Over such a store a
// handler must have no effect outside the store's transaction, which is
// why Middleware refuses one unless WithRepeats says the handlers are
// written for it.
package httpguard

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
)

// DefaultMaxBody is the largest request body Middleware reads unless
// WithMaxBody says otherwise: 1 MiB.
const DefaultMaxBody = 1 << 20

// The default header names.
const (
	TokenHeader    = "Fencing-Token"
	SequenceHeader = "Fencing-Sequence"
)

// ProblemType identifies a stale rejection in problem+json bodies.
const ProblemType = "https://fence.dev/problems/stale-token"

// Problem is the RFC 9457 body of a rejection.
type Problem struct {
	Type           string `json:"type"`
	Title          string `json:"title"`
	Status         int    `json:"status"`
	Detail         string `json:"detail"`
	Scope          string `json:"scope,omitempty"`
	PresentedToken uint64 `json:"presented_token,omitempty"`
	HighestToken   uint64 `json:"highest_token,omitempty"`
}

// Option configures Middleware.
type Option interface{ apply(*middleware) }

type optionFunc func(*middleware)

func (f optionFunc) apply(m *middleware) { f(m) }

// WithHeader reads the token from the named header instead of
// Fencing-Token.
func WithHeader(name string) Option { return optionFunc(func(m *middleware) { m.header = name }) }

// WithScopeFunc picks the scope per request, for routes that guard many
// scopes (a shard per path segment, say). It replaces the fixed scope.
func WithScopeFunc(f func(*http.Request) string) Option {
	return optionFunc(func(m *middleware) { m.scopeOf = f })
}

// WithUnfencedReads lets the methods HTTP calls safe (GET, HEAD, OPTIONS
// and TRACE) pass to the handler unchecked, with or without a token; the
// others are fenced. Give it only when the handler writes on none of
// them, and when an old holder reading what a newer one wrote is harmless.
func WithUnfencedReads() Option { return optionFunc(func(m *middleware) { m.unfencedReads = true }) }

// WithRepeats accepts a guard whose store may run a handler more than
// once for one request (a guard.Repeater, such as boltguard's Batched
// store). Give it only when every handler behind the middleware changes
// nothing but the store's transaction: each run reads the request body
// from its start, and only the last run's writes and answer are kept, but
// a side effect elsewhere (a call to another service, a message sent)
// happens once per run. Without it, Middleware refuses such a guard.
func WithRepeats() Option { return optionFunc(func(m *middleware) { m.repeatsOK = true }) }

// WithMaxBody reads request bodies of up to n bytes, instead of
// DefaultMaxBody, before the fenced section; a larger body is answered 413
// Content Too Large. n must be positive: Middleware refuses others.
func WithMaxBody(n int64) Option { return optionFunc(func(m *middleware) { m.maxBody = n }) }

type middleware struct {
	g         *guard.Guard
	maxBody   int64
	repeats   bool // g's store may run a handler more than once
	repeatsOK bool // and the caller said its handlers allow it
	header    string
	scopeOf   func(*http.Request) string

	unfencedReads bool // WithUnfencedReads
}

// Middleware returns a middleware that fences requests to scope with g. It
// fails if g's store may run a handler more than once and WithRepeats is
// not given. The middleware is safe for concurrent use.
func Middleware(g *guard.Guard, scope string, opts ...Option) (func(http.Handler) http.Handler, error) {
	m := &middleware{g: g, repeats: g.Repeats(), header: TokenHeader, maxBody: DefaultMaxBody,
		scopeOf: func(*http.Request) string { return scope }}
	for _, o := range opts {
		o.apply(m)
	}
	if m.maxBody <= 0 {
		return nil, fmt.Errorf("httpguard: WithMaxBody(%d): want a positive number of bytes", m.maxBody)
	}
	if m.repeats && !m.repeatsOK {
		return nil, errors.New("httpguard: the guard's store may run a handler more than once for one request " +
			"(a guard.Repeater, such as boltguard's Batched store); give httpguard.WithRepeats() if every handler " +
			"changes nothing but the store's transaction, or use a store that runs it once")
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(next, w, r) })
	}, nil
}

func safe(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

func (m *middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	if m.unfencedReads && safe(r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	scope := m.scopeOf(r)
	wr, err := m.write(r)
	if err != nil {
		writeProblem(w, Problem{Type: "about:blank", Title: "Bad fencing token", Status: http.StatusBadRequest, Detail: err.Error(), Scope: scope})
		return
	}
	// The body is read before the fenced section, which holds the store's
	// write transaction: a client sending it slowly must not hold that.
	body, p := m.readBody(w, r)
	if p != nil {
		p.Scope = scope
		writeProblem(w, *p)
		return
	}
	// The handler's answer waits until the fenced section has ended: a
	// store that commits the handler's writes with the mark (boltguard,
	// sqlguard) can still fail to commit after the handler wrote its
	// status, and the client must not hear that a write succeeded that
	// was rolled back.
	var ans *answer
	err = m.g.Fence(r.Context(), scope, wr, func(ctx context.Context) error {
		// A store that runs this again keeps only the last run's writes,
		// so only the last run's answer counts; each run reads the body
		// from its start.
		ans = &answer{header: w.Header().Clone()}
		req := r.WithContext(ctx)
		req.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(ans, req)
		if ans.failed() {
			return errFailed
		}
		return nil
	})
	var stale *guard.StaleError
	switch {
	case err == nil:
		ans.send(w)
	case errors.Is(err, errFailed):
		// The store rolled the handler's writes back. The token passed
		// the check all the same: record it, so that older leases'
		// writes are refused from now on. If that fails, the next write
		// records it; the client hears the handler's failure either way.
		_ = m.g.Advance(r.Context(), scope, wr.Token)
		ans.send(w)
	case errors.As(err, &stale):
		writeProblem(w, Problem{
			Type: ProblemType, Title: "Stale fencing token", Status: http.StatusConflict, Detail: stale.Error(),
			Scope: stale.Scope, PresentedToken: stale.Presented, HighestToken: stale.Highest,
		})
	case errors.Is(err, fence.ErrInvalid):
		writeProblem(w, Problem{Type: "about:blank", Title: "Bad fencing token", Status: http.StatusBadRequest, Detail: err.Error(), Scope: scope})
	default:
		writeProblem(w, Problem{Type: "about:blank", Title: "Fencing check failed", Status: http.StatusInternalServerError, Detail: err.Error(), Scope: scope})
	}
}

// readBody reads r's body whole, up to m.maxBody bytes. A body that is
// larger, or cannot be read, gets a problem to answer instead.
func (m *middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *Problem) {
	tooLarge := &Problem{Type: "about:blank", Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
		Detail: fmt.Sprintf("the request body is larger than %d bytes", m.maxBody)}
	if r.ContentLength > m.maxBody {
		return nil, tooLarge
	}
	if r.Body == nil {
		return nil, nil
	}
	// MaxBytesReader also has the server close the connection after a
	// body that is too large, rather than read the rest of it.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.maxBody))
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return nil, tooLarge
	}
	if err != nil {
		return nil, &Problem{Type: "about:blank", Title: "Request body unreadable", Status: http.StatusBadRequest,
			Detail: "reading the request body: " + err.Error()}
	}
	return body, nil
}

// write reads the token and sequence headers.
func (m *middleware) write(r *http.Request) (guard.Write, error) {
	vals := r.Header.Values(m.header)
	switch len(vals) {
	case 0:
		return guard.Write{}, fmt.Errorf("missing %s header: want the lease's token, e.g. %s: fence:v1:SCOPE:TOKEN", m.header, m.header)
	case 1:
	default:
		return guard.Write{}, fmt.Errorf("%d %s headers: want exactly one", len(vals), m.header)
	}
	tok, err := fence.ParseToken(vals[0])
	if err != nil {
		return guard.Write{}, fmt.Errorf("%s header: %w", m.header, err)
	}
	w := guard.Write{Token: tok}
	seqs := r.Header.Values(SequenceHeader)
	if len(seqs) > 1 {
		// Like the token, and unlike Header.Get, which would take the
		// first: a proxy in front may read another one.
		return guard.Write{}, fmt.Errorf("%d %s headers: want at most one", len(seqs), SequenceHeader)
	}
	if s := r.Header.Get(SequenceHeader); s != "" {
		seq, err := strconv.ParseUint(s, 10, 64)
		if err != nil || seq == 0 {
			return guard.Write{}, fmt.Errorf("%s header %q: want a decimal integer from 1 to %d", SequenceHeader, s, uint64(1<<64-1))
		}
		w.Seq = seq
	}
	return w, nil
}

func writeProblem(w http.ResponseWriter, p Problem) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// errFailed makes the store roll back the writes of a handler that
// answered an error.
var errFailed = errors.New("httpguard: the handler answered an error status")

// answer is a handler's response held back: its header, status and body.
type answer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (a *answer) Header() http.Header { return a.header }

func (a *answer) WriteHeader(code int) {
	if a.status == 0 {
		a.status = code
	}
}

func (a *answer) Write(p []byte) (int, error) {
	a.WriteHeader(http.StatusOK)
	return a.body.Write(p)
}

// failed reports whether the handler answered a client or server error.
func (a *answer) failed() bool { return a.status >= http.StatusBadRequest }

// send writes the answer to w, as the handler would have.
func (a *answer) send(w http.ResponseWriter) {
	h := w.Header()
	clear(h)
	maps.Copy(h, a.header)
	w.WriteHeader(cmp.Or(a.status, http.StatusOK))
	if a.body.Len() > 0 {
		_, _ = w.Write(a.body.Bytes()) // the client went away: nothing to tell it
	}
}
