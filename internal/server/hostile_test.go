package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
)

// hostile is one bad request, sent as JSON by a raw HTTP client, as binary
// protobuf when it has a proto form, and through the Go client when the Go
// API can express it.
type hostile struct {
	name   string
	path   string        // the procedure
	body   string        // its JSON
	proto  proto.Message // its binary form, if it has one (JSON can say what proto cannot, and back)
	call   func(ctx context.Context, c *client.Client) error
	code   string // the Connect code
	field  string // for invalid_argument: the field the answer names
	says   string // what the answer says (is allowed)
	isErr  error  // what the Go client's error matches
	notErr error  // what it must not match
	scopes []string
}

// TestHostileRequests sends each hostile request to a real server. Every
// answer is a clear error (the right code, naming the field and what is
// allowed) and nothing changes: List, Get and Status read the same before
// and after.
func TestHostileRequests(t *testing.T) {
	const allowedScope = "want 1 to 256 bytes of letters, digits, '.', '_', '-' and '/'"
	const allowedChars = "allowed are ASCII letters, digits, '.', '_', '-' and '/'"
	const ttlRange = "outside the allowed range 100ms to 5m0s"
	acquire := func(scope string, opts ...client.AcquireOption) func(context.Context, *client.Client) error {
		return func(ctx context.Context, c *client.Client) error {
			_, err := c.Grant(ctx, scope, opts...)
			return err
		}
	}
	huge := strings.Repeat("a", 2<<20)
	cases := []hostile{
		{name: "empty scope", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":""}`,
			proto: &fencev1.AcquireRequest{}, call: acquire(""),
			code: "invalid_argument", field: "scope", says: allowedScope, isErr: fence.ErrInvalid},
		{name: "2 MiB scope", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":"` + huge + `"}`,
			proto: &fencev1.AcquireRequest{Scope: huge}, call: acquire(huge),
			code: "resource_exhausted", says: "is larger than configured max 65536", notErr: fence.ErrTokensExhausted},
		{name: "60 000-byte scope", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":"` + huge[:60000] + `"}`,
			proto: &fencev1.AcquireRequest{Scope: huge[:60000]}, call: acquire(huge[:60000]),
			code: "invalid_argument", field: "scope", says: "60000 bytes long, at most 256 allowed", isErr: fence.ErrInvalid},
		{name: "NUL in the scope", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":"a\u0000b"}`,
			proto: &fencev1.AcquireRequest{Scope: "a\x00b"}, call: acquire("a\x00b"),
			code: "invalid_argument", field: "scope", says: allowedChars, isErr: fence.ErrInvalid},
		{name: "invalid UTF-8 in the scope", path: fencev1connect.LeaseServiceAcquireProcedure, body: "{\"scope\":\"a\xffb\"}",
			code: "invalid_argument", says: "invalid UTF-8"},
		{name: "../ scope", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":"../x"}`,
			proto: &fencev1.AcquireRequest{Scope: "../x"}, call: acquire("../x"),
			code: "invalid_argument", field: "scope", says: `".." segment`, isErr: fence.ErrInvalid},
		{name: "scope as a number", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":1e309}`,
			code: "invalid_argument", says: "invalid value for string field scope"},
		{name: "TTL 0", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":"x","ttl":"0s"}`,
			proto: &fencev1.AcquireRequest{Scope: "x", Ttl: &durationpb.Duration{}},
			code:  "invalid_argument", field: "ttl", says: ttlRange, scopes: []string{"x"}},
		{name: "negative TTL", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":"x","ttl":"-1s"}`,
			proto: &fencev1.AcquireRequest{Scope: "x", Ttl: durationpb.New(-time.Second)}, call: acquire("x", client.WithTTL(-time.Second)),
			code: "invalid_argument", field: "ttl", says: ttlRange, isErr: fence.ErrInvalid, scopes: []string{"x"}},
		{name: "TTL above the maximum", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":"x","ttl":"301s"}`,
			proto: &fencev1.AcquireRequest{Scope: "x", Ttl: durationpb.New(301 * time.Second)}, call: acquire("x", client.WithTTL(301*time.Second)),
			code: "invalid_argument", field: "ttl", says: ttlRange, isErr: fence.ErrInvalid, scopes: []string{"x"}},
		{name: "TTL beyond a Duration", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":"x","ttl":"315576000001s"}`,
			code: "invalid_argument", says: `Duration value out of range: "315576000001s"`, scopes: []string{"x"}},
		{name: "TTL 1e309s", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":"x","ttl":"1e309s"}`,
			code: "invalid_argument", says: `invalid google.protobuf.Duration value "1e309s"`, scopes: []string{"x"}},
		{name: "TTL beyond a Duration, binary", path: fencev1connect.LeaseServiceAcquireProcedure,
			proto: &fencev1.AcquireRequest{Scope: "x", Ttl: &durationpb.Duration{Seconds: 315576000001}},
			code:  "invalid_argument", field: "ttl", says: ttlRange, scopes: []string{"x"}},
		{name: "TTL with nanos beyond a second", path: fencev1connect.LeaseServiceAcquireProcedure,
			proto: &fencev1.AcquireRequest{Scope: "x", Ttl: &durationpb.Duration{Seconds: 1, Nanos: 2_000_000_000}},
			code:  "invalid_argument", field: "ttl", says: ttlRange, scopes: []string{"x"}},
		{name: "TTL with mixed signs", path: fencev1connect.LeaseServiceAcquireProcedure,
			proto: &fencev1.AcquireRequest{Scope: "x", Ttl: &durationpb.Duration{Seconds: 1, Nanos: -500_000_000}},
			code:  "invalid_argument", field: "ttl", says: ttlRange, scopes: []string{"x"}},
		{name: "holder too long", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":"x","holder":"` + huge[:129] + `"}`,
			proto: &fencev1.AcquireRequest{Scope: "x", Holder: huge[:129]}, call: acquire("x", client.WithHolder(huge[:129])),
			code: "invalid_argument", field: "holder", says: "129 bytes long, at most 128 allowed", isErr: fence.ErrInvalid, scopes: []string{"x"}},
		{name: "request ID too long", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":"x","request_id":"` + huge[:65] + `"}`,
			proto: &fencev1.AcquireRequest{Scope: "x", RequestId: huge[:65]}, call: acquire("x", client.WithRequestID(huge[:65])),
			code: "invalid_argument", field: "request_id", says: "65 bytes long, at most 64 allowed", isErr: fence.ErrInvalid, scopes: []string{"x"}},
		{name: "wait as a string", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":"x","wait":"yes"}`,
			code: "invalid_argument", says: `invalid value for bool field wait: "yes"`, scopes: []string{"x"}},
		{name: "truncated JSON", path: fencev1connect.LeaseServiceAcquireProcedure, body: `{"scope":"x"`,
			code: "invalid_argument", says: "unexpected EOF", scopes: []string{"x"}},

		{name: "renew, empty lease ID", path: fencev1connect.LeaseServiceRenewProcedure, body: `{"scope":"held"}`,
			proto: &fencev1.RenewRequest{Scope: "held"},
			code:  "invalid_argument", field: "lease_id", says: "32 hexadecimal"},
		{name: "renew, zero lease ID", path: fencev1connect.LeaseServiceRenewProcedure, body: `{"scope":"held","lease_id":"00000000000000000000000000000000"}`,
			proto: &fencev1.RenewRequest{Scope: "held", LeaseId: strings.Repeat("0", 32)},
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.Renew(ctx, "held", fence.LeaseID{})
				return err
			},
			code: "invalid_argument", field: "lease_id", isErr: fence.ErrInvalid},
		{name: "renew, 33 hex digits", path: fencev1connect.LeaseServiceRenewProcedure, body: `{"scope":"held","lease_id":"` + strings.Repeat("f", 33) + `"}`,
			proto: &fencev1.RenewRequest{Scope: "held", LeaseId: strings.Repeat("f", 33)},
			code:  "invalid_argument", field: "lease_id", says: "32 hexadecimal"},
		{name: "renew, NUL in the lease ID", path: fencev1connect.LeaseServiceRenewProcedure, body: `{"scope":"held","lease_id":"` + strings.Repeat("f", 31) + `\u0000"}`,
			proto: &fencev1.RenewRequest{Scope: "held", LeaseId: strings.Repeat("f", 31) + "\x00"},
			code:  "invalid_argument", field: "lease_id", says: "32 hexadecimal"},
		{name: "renew, a lease ID that never held", path: fencev1connect.LeaseServiceRenewProcedure, body: `{"scope":"held","lease_id":"` + strings.Repeat("e", 32) + `"}`,
			proto: &fencev1.RenewRequest{Scope: "held", LeaseId: strings.Repeat("e", 32)},
			code:  "not_found", says: "no current or recent lease with that ID", isErr: fence.ErrNotHolder},
		{name: "release, a lease ID that never held", path: fencev1connect.LeaseServiceReleaseProcedure, body: `{"scope":"held","lease_id":"` + strings.Repeat("e", 32) + `"}`,
			proto: &fencev1.ReleaseRequest{Scope: "held", LeaseId: strings.Repeat("e", 32)},
			code:  "not_found", says: "no current or recent lease with that ID", isErr: fence.ErrNotHolder},
		{name: "release, ../ scope", path: fencev1connect.LeaseServiceReleaseProcedure, body: `{"scope":"../held","lease_id":"` + strings.Repeat("e", 32) + `"}`,
			proto: &fencev1.ReleaseRequest{Scope: "../held", LeaseId: strings.Repeat("e", 32)},
			code:  "invalid_argument", field: "scope", says: `".." segment`},

		{name: "get, empty scope", path: fencev1connect.LeaseServiceGetProcedure, body: `{}`,
			proto: &fencev1.GetRequest{},
			call:  func(ctx context.Context, c *client.Client) error { _, err := c.Get(ctx, ""); return err },
			code:  "invalid_argument", field: "scope", says: allowedScope, isErr: fence.ErrInvalid},
		{name: "list, page size above the maximum", path: fencev1connect.LeaseServiceListProcedure, body: `{"page_size":1001}`,
			proto: &fencev1.ListRequest{PageSize: 1001},
			code:  "invalid_argument", field: "page_size", says: "1001 is above the maximum 1000"},
		{name: "list, a page token not given out", path: fencev1connect.LeaseServiceListProcedure, body: `{"page_token":"Li4vYQ"}`,
			proto: &fencev1.ListRequest{PageToken: "Li4vYQ"},
			code:  "invalid_argument", field: "page_token", says: "not a next_page_token this service returned"},
		{name: "list, a prefix with NUL", path: fencev1connect.LeaseServiceListProcedure, body: `{"prefix":"a\u0000"}`,
			proto: &fencev1.ListRequest{Prefix: "a\x00"},
			call:  func(ctx context.Context, c *client.Client) error { _, err := c.List(ctx, "a\x00"); return err },
			code:  "invalid_argument", field: "prefix", isErr: fence.ErrInvalid},

		{name: "add a node to a node without a Raft listener", path: fencev1connect.ClusterServiceAddNodeProcedure,
			body:  `{"id":"n2","raft_addr":"127.0.0.1:1","api_addr":"127.0.0.1:2"}`,
			proto: &fencev1.AddNodeRequest{Id: "n2", RaftAddr: "127.0.0.1:1", ApiAddr: "127.0.0.1:2"},
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.AddNode(ctx, "n2", "127.0.0.1:1", "127.0.0.1:2")
				return err
			},
			code: "invalid_argument", field: "raft_addr", says: "--raft-listen", isErr: fence.ErrInvalid},
		{name: "remove the only node", path: fencev1connect.ClusterServiceRemoveNodeProcedure, body: `{"id":"n1"}`,
			proto: &fencev1.RemoveNodeRequest{Id: "n1"},
			call:  func(ctx context.Context, c *client.Client) error { _, err := c.RemoveNode(ctx, "n1"); return err },
			code:  "invalid_argument", field: "node_id", says: "a cluster cannot remove its last node", isErr: fence.ErrInvalid},
	}
	srv := fencetest.NewServer()
	t.Cleanup(srv.Close)
	raw := newRawClient(t, srv.Addr)
	in := newInspector(t, srv.Addr)
	in.seed(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := rpc{path: tc.path}
			scopes := append([]string{"held", "released"}, tc.scopes...)
			check := func(how string, send func() answer) {
				t.Helper()
				before := in.snapshot(t, scopes...)
				a := send()
				switch {
				case a.code != tc.code:
					t.Errorf("%s: answered %q (%.300s), want %s", how, a.code, a.msg, tc.code)
				case tc.field != "" && !strings.HasPrefix(a.msg, "invalid "+tc.field+": "):
					t.Errorf("%s: %.300q does not name the field %s", how, a.msg, tc.field)
				case !strings.Contains(a.msg, tc.says):
					t.Errorf("%s: %.300q does not say %q", how, a.msg, tc.says)
				}
				if diff := cmp.Diff(before, in.snapshot(t, scopes...)); diff != "" {
					t.Errorf("%s: the refused request changed the state (-before +after):\n%s", how, diff)
				}
			}
			if tc.body != "" {
				check("JSON", func() answer { return raw.post(t, m, false, []byte(tc.body)) })
			}
			if tc.proto != nil {
				b, err := proto.Marshal(tc.proto)
				if err != nil {
					t.Fatal(err)
				}
				check("protobuf", func() answer { return raw.post(t, m, true, b) })
			}
			if tc.call == nil {
				return
			}
			before := in.snapshot(t, scopes...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := tc.call(ctx, c)
			switch {
			case err == nil:
				t.Errorf("Go client: no error")
			case tc.isErr != nil && !errors.Is(err, tc.isErr):
				t.Errorf("Go client: %.300v does not match %v", err, tc.isErr)
			case tc.notErr != nil && errors.Is(err, tc.notErr):
				t.Errorf("Go client: %.300v matches %v", err, tc.notErr)
			case !strings.Contains(err.Error(), tc.says):
				t.Errorf("Go client: %.300q does not say %q", err, tc.says)
			}
			var ie *fence.InvalidError
			if tc.field != "" && (!errors.As(err, &ie) || ie.Field != tc.field) {
				t.Errorf("Go client: %.300v is not an InvalidError for %s", err, tc.field)
			}
			if diff := cmp.Diff(before, in.snapshot(t, scopes...)); diff != "" {
				t.Errorf("Go client: the refused request changed the state (-before +after):\n%s", diff)
			}
		})
	}
}

// TestReplayedRequestID: holder B presents the request ID of holder A's
// acquire, while A holds the scope, while A waits in line and after A
// released. With auth off a request ID is bound to its holder, so B's
// acquire is B's own, answered as one with a request ID never used: held
// while the scope is held, in line when it waits, granted a lease of its
// own once the scope is free. B never learns A's lease ID, nor whether A
// used that ID (it was once told "already used by another holder"), and
// takes nothing of A's; A's own retry still gets A's grant, or lost once
// it ended.
func TestReplayedRequestID(t *testing.T) {
	srv := fencetest.NewServer()
	t.Cleanup(srv.Close)
	in := newInspector(t, srv.Addr)
	raw := newRawClient(t, srv.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := srv.Client(client.WithHolder("A"))
	b := srv.Client(client.WithHolder("B"))
	other := srv.Client(client.WithHolder("C"))
	t.Cleanup(func() { a.Close(); b.Close(); other.Close() })

	// heldForB: B's acquire with A's request ID, and one with an ID never
	// used, are both refused as held, without a lease ID, changing nothing.
	heldForB := func(t *testing.T, scope, reqID string, secret fence.LeaseID) {
		t.Helper()
		before := in.snapshot(t, scope)
		for _, id := range []string{reqID, "never-used"} {
			ans := raw.post(t, rpc{path: fencev1connect.LeaseServiceAcquireProcedure}, false,
				[]byte(`{"scope":"`+scope+`","holder":"B","request_id":"`+id+`"}`))
			if ans.code != "aborted" || !strings.Contains(ans.msg, "is held by") || strings.Contains(ans.msg, secret.String()) {
				t.Errorf("B with request ID %q: %s %q; want aborted, held, as with any request ID", id, ans.code, ans.msg)
			}
		}
		if diff := cmp.Diff(before, in.snapshot(t, scope)); diff != "" {
			t.Errorf("B's refused acquires changed the state (-before +after):\n%s", diff)
		}
	}
	// ownGrant: B, granted with A's request ID, has a lease of its own,
	// after the token that closed A's.
	ownGrant := func(t *testing.T, lb fence.Lease, err error, of fence.Lease) {
		t.Helper()
		if err != nil || lb.Holder != "B" || lb.ID == of.ID || lb.Token != of.Token+2 {
			t.Errorf("B with A's request ID: %+v, %v; want a lease of B's own, token %d", lb, err, of.Token+2)
		}
	}

	t.Run("while A holds", func(t *testing.T) {
		la, err := a.Grant(ctx, "orders", client.WithRequestID("R"))
		if err != nil {
			t.Fatal(err)
		}
		heldForB(t, "orders", "R", la.ID)
		again, err := a.Grant(ctx, "orders", client.WithRequestID("R"))
		if err != nil || again.ID != la.ID || again.Token != la.Token {
			t.Errorf("A's retry = %+v, %v; want A's grant %v token %d", again, err, la.ID, la.Token)
		}
		// Waiting, B queues behind A as anyone would, and is granted its
		// own lease once A releases.
		type granted struct {
			l   fence.Lease
			err error
		}
		gb := make(chan granted, 1)
		go func() {
			l, err := b.Grant(ctx, "orders", client.WithRequestID("R"), client.WithWait())
			gb <- granted{l, err}
		}()
		awaitWaiters(ctx, t, a, "orders", 1)
		if _, err := a.Release(ctx, "orders", la.ID); err != nil {
			t.Fatal(err)
		}
		g := <-gb
		ownGrant(t, g.l, g.err, la)
	})
	t.Run("while A waits", func(t *testing.T) {
		lc, err := other.Grant(ctx, "billing")
		if err != nil {
			t.Fatal(err)
		}
		granted := make(chan fence.Lease, 1)
		go func() {
			l, err := a.Grant(ctx, "billing", client.WithRequestID("Q"), client.WithWait())
			if err != nil {
				t.Errorf("A's wait: %v", err)
			}
			granted <- l
		}()
		awaitWaiters(ctx, t, a, "billing", 1)
		heldForB(t, "billing", "Q", fence.LeaseID{})
		if _, err := other.Release(ctx, "billing", lc.ID); err != nil {
			t.Fatal(err)
		}
		la := <-granted
		if la.Holder != "A" || la.Token != lc.Token+2 {
			t.Errorf("A was granted %+v; want A with token %d, after the closing of %d", la, lc.Token+2, lc.Token)
		}
		heldForB(t, "billing", "Q", la.ID)
	})
	t.Run("after A released", func(t *testing.T) {
		la, err := a.Grant(ctx, "audit", client.WithRequestID("P"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Release(ctx, "audit", la.ID); err != nil {
			t.Fatal(err)
		}
		lb, err := b.Grant(ctx, "audit", client.WithRequestID("P"))
		ownGrant(t, lb, err, la)
		if again, err := a.Grant(ctx, "audit", client.WithRequestID("P")); !errors.Is(err, fence.ErrLeaseLost) {
			t.Errorf("A's retry after its release = %+v, %v; want lost", again, err)
		}
	})
}

// awaitWaiters polls until scope has n acquires waiting in line.
func awaitWaiters(ctx context.Context, t *testing.T, c *client.Client, scope string, n int) {
	t.Helper()
	for i := 0; ; i++ {
		st, err := c.Get(ctx, scope)
		if err != nil || i == 2000 {
			t.Fatalf("%d waiting in %s never: %+v, %v", n, scope, st, err)
		}
		if st.Waiters == n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLeaseIDOfAnotherScope: a lease ID of one scope renews and releases
// nothing of another.
func TestLeaseIDOfAnotherScope(t *testing.T) {
	srv := fencetest.NewServer()
	t.Cleanup(srv.Close)
	in := newInspector(t, srv.Addr)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	la, err := c.Grant(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Grant(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	before := in.snapshot(t, "a", "b", "c")
	for name, call := range map[string]func() error{
		"renew b":   func() error { _, err := c.Renew(ctx, "b", la.ID); return err },
		"release b": func() error { _, err := c.Release(ctx, "b", la.ID); return err },
		"renew c":   func() error { _, err := c.Renew(ctx, "c", la.ID); return err },
		"release c": func() error { _, err := c.Release(ctx, "c", la.ID); return err },
	} {
		if err := call(); !errors.Is(err, fence.ErrNotHolder) {
			t.Errorf("%s with a's lease ID: %v, want ErrNotHolder", name, err)
		}
	}
	if diff := cmp.Diff(before, in.snapshot(t, "a", "b", "c")); diff != "" {
		t.Errorf("a foreign lease ID changed the state (-before +after):\n%s", diff)
	}
}
