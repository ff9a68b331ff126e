package httpguard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
)

// Lease is what the client side needs of a lease; *client.Lease has it.
type Lease interface {
	Token() fence.Token
	Err() error
	MarkLost(cause error)
}

// Transport adds its lease's token to every request and marks the lease
// lost when a guard answers that the token is stale: a 409 Conflict with
// a stale-token problem (ProblemType) whose scope and presented_token, if
// given, are the lease's. A stale problem naming another scope or token
// (a server passing on the refusal of its own write downstream) is
// returned as it came and leaves the lease alone. Every answer's body
// reaches the caller whole, a stale answer's included. Once the lease is
// lost, requests fail without being sent: retrying a stale token can never
// succeed. It is safe for concurrent use.
type Transport struct {
	lease  Lease
	base   http.RoundTripper
	header string
}

// NewTransport returns a Transport over base (http.DefaultTransport if
// nil).
func NewTransport(lease Lease, base http.RoundTripper) *Transport {
	if base == nil {
		base = http.DefaultTransport
	}
	return &Transport{lease: lease, base: base, header: TokenHeader}
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if err := t.lease.Err(); err != nil {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, fmt.Errorf("httpguard: not sent: %w", err)
	}
	tok := t.lease.Token()
	r = r.Clone(r.Context())
	r.Header.Set(t.header, tok.String())
	resp, err := t.base.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusConflict {
		return resp, err
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/problem+json" {
		return resp, nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxStaleAnswer+1))
	if err != nil || len(body) > maxStaleAnswer {
		// Not a stale answer: the caller reads the body as it came, the
		// bytes read here and then the rest, or the error that cut it.
		rest := io.Reader(resp.Body)
		if err != nil {
			rest = failed{err}
		}
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(body), rest), resp.Body}
		return resp, nil
	}
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	var p Problem
	if json.Unmarshal(body, &p) != nil || p.Type != ProblemType {
		return resp, nil
	}
	// A server may pass on the rejection of another lease's token (its
	// own write downstream): that says nothing about this lease. Fields
	// the problem lacks are given the benefit of the doubt, so that a
	// terse guard still ends the lease, as grpcguard's client does.
	if p.Scope != "" && p.Scope != tok.Scope || p.PresentedToken != 0 && p.PresentedToken != tok.Value {
		return resp, nil
	}
	t.lease.MarkLost(&guard.StaleError{Scope: tok.Scope, Presented: tok.Value, Highest: p.HighestToken})
	return resp, nil
}

// maxStaleAnswer bounds what Transport reads of a 409 to tell a stale
// answer, which takes a few hundred bytes: a longer body is not one.
const maxStaleAnswer = 64 << 10

// readCloser reads from one reader and closes another.
type readCloser struct {
	io.Reader
	io.Closer
}

// failed is a reader that fails with its error.
type failed struct{ err error }

func (f failed) Read([]byte) (int, error) { return 0, f.err }
