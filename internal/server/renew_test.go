package server

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/wire"
)

// TestRenewBatch: each renewal of a batch is answered on its own, as Renew
// would answer it, in the request's order.
func TestRenewBatch(t *testing.T) {
	s := startWith(t, func(*Config) {})
	rpc := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr())
	ctx := context.Background()
	acquire := func(scope string) *fencev1.Lease {
		t.Helper()
		r, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: scope, Holder: "h", Ttl: durationpb.New(time.Minute)}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.Lease
	}
	a, b, c := acquire("a"), acquire("b"), acquire("c")
	if _, err := rpc.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{Scope: "b", LeaseId: b.LeaseId})); err != nil {
		t.Fatal(err)
	}
	unknown := fence.NewLeaseID().String()
	resp, err := rpc.RenewBatch(ctx, connect.NewRequest(&fencev1.RenewBatchRequest{Renewals: []*fencev1.RenewRequest{
		{Scope: "a", LeaseId: a.LeaseId},
		{Scope: "b", LeaseId: b.LeaseId},
		{Scope: "c", LeaseId: c.LeaseId},
		{Scope: "c", LeaseId: unknown},
		{Scope: "a", LeaseId: a.LeaseId}, // twice is harmless
	}}))
	if err != nil {
		t.Fatal(err)
	}
	got := resp.Msg.Results
	if len(got) != 5 {
		t.Fatalf("%d results, want 5", len(got))
	}
	for _, i := range []int{0, 2, 4} {
		if got[i].Failure != nil || got[i].ExpiresIn.AsDuration() != time.Minute {
			t.Errorf("result %d = %v; want renewed for its TTL of 1m", i, got[i])
		}
	}
	// The renewal moved the deadline: a full TTL from the renewal.
	if g, err := rpc.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: "a"})); err != nil || g.Msg.Lease.Token != a.Token || g.Msg.Lease.ExpiresIn.AsDuration() < 50*time.Second {
		t.Errorf("a after the batch: %v, %v; want held with token %d, about a minute left", g.Msg, err, a.Token)
	}
	var lost *fence.LostError
	if err := wire.FromFailure(got[1].Failure); got[1].ExpiresIn != nil || !errors.As(err, &lost) || lost.Token != b.Token {
		t.Errorf("released b: %v, %v; want lost with token %d", got[1], err, b.Token)
	}
	if err := wire.FromFailure(got[3].Failure); got[3].ExpiresIn != nil || !errors.Is(err, fence.ErrNotHolder) || got[3].Failure.Code != "not_found" {
		t.Errorf("c with an unknown ID: %v, %v; want not the holder", got[3], err)
	}
	// The same failures as Renew's, code and message.
	_, one := rpc.Renew(ctx, connect.NewRequest(&fencev1.RenewRequest{Scope: "b", LeaseId: b.LeaseId}))
	if f := got[1].Failure; connect.CodeOf(one).String() != f.Code || !strings.Contains(one.Error(), f.Message) {
		t.Errorf("batch failure %v; Renew answered %v", f, one)
	}
}

// TestRenewBatchBadInput: a malformed batch is refused as a whole, saying
// which renewal is wrong, and renews nothing.
func TestRenewBatchBadInput(t *testing.T) {
	s := startWith(t, func(*Config) {})
	rpc := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr())
	ctx := context.Background()
	r, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "a", Holder: "h", Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	left := func() time.Duration {
		t.Helper()
		g, err := rpc.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: "a"}))
		if err != nil {
			t.Fatal(err)
		}
		return g.Msg.Lease.ExpiresIn.AsDuration()
	}
	time.Sleep(100 * time.Millisecond)
	before := left()
	good := &fencev1.RenewRequest{Scope: "a", LeaseId: r.Msg.Lease.LeaseId}
	full := make([]*fencev1.RenewRequest, maxRenewBatch+1)
	for i := range full {
		full[i] = good
	}
	cases := []struct {
		name     string
		renewals []*fencev1.RenewRequest
		field    string
	}{
		{"empty", nil, "renewals"},
		{"too many", full, "renewals"},
		{"bad scope", []*fencev1.RenewRequest{good, {Scope: "a b", LeaseId: good.LeaseId}}, "renewals[1].scope"},
		{"empty scope", []*fencev1.RenewRequest{good, {LeaseId: good.LeaseId}}, "renewals[1].scope"},
		{"truncated lease ID", []*fencev1.RenewRequest{good, good, {Scope: "a", LeaseId: good.LeaseId[:20]}}, "renewals[2].lease_id"},
	}
	for _, tc := range cases {
		_, err := rpc.RenewBatch(ctx, connect.NewRequest(&fencev1.RenewBatchRequest{Renewals: tc.renewals}))
		var inv *fence.InvalidError
		if !errors.As(wire.FromConnect(err), &inv) || inv.Field != tc.field {
			t.Errorf("%s: %v; want invalid %s", tc.name, err, tc.field)
		}
	}
	// Nothing was renewed: a renewal would have moved the deadline a full
	// TTL ahead of now, past where it was.
	if after := left(); after > before {
		t.Errorf("time left %v after the refused batches, %v before: a renewal slipped through", after, before)
	}
}

// TestRenewalsLeaveTheRingToOthers: one holder naming its lease a thousand
// times in each of eleven RenewBatch calls records a renewal a batch at
// most, not the 11,000 that pushed every other scope's grants out of the
// leader's ring of 10,000 events; once the lease is released, eleven such
// calls answered lost record one loss. A watch of another prefix still
// resumes from a position before them all, and finds its grant there.
func TestRenewalsLeaveTheRingToOthers(t *testing.T) {
	s := startWith(t, func(*Config) {})
	rpc := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	from := s.events.Position(s.node.Term())
	acquire := func(scope string) *fencev1.Lease {
		t.Helper()
		r, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: scope, Holder: scope, Ttl: durationpb.New(time.Minute)}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.Lease
	}
	billing, orders := acquire("billing/a"), acquire("orders/a")
	batch := make([]*fencev1.RenewRequest, maxRenewBatch)
	for i := range batch {
		batch[i] = &fencev1.RenewRequest{Scope: "orders/a", LeaseId: orders.LeaseId}
	}
	const batches = 11
	renew := func(want string) {
		t.Helper()
		for range batches {
			resp, err := rpc.RenewBatch(ctx, connect.NewRequest(&fencev1.RenewBatchRequest{Renewals: batch}))
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range resp.Msg.Results {
				if got := r.GetFailure().GetCode(); got != want {
					t.Fatalf("renewal %d: %v; want failure code %q", i, r, want)
				}
			}
		}
	}
	renew("")
	if _, err := rpc.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{Scope: "orders/a", LeaseId: orders.LeaseId})); err != nil {
		t.Fatal(err)
	}
	renew("failed_precondition") // lost
	watch := func(prefix string) []*fencev1.WatchEvent {
		t.Helper()
		stream, err := rpc.Watch(ctx, connect.NewRequest(&fencev1.WatchRequest{Prefix: prefix, StartPosition: from}))
		if err != nil {
			t.Fatal(err)
		}
		defer stream.Close()
		if !stream.Receive() {
			t.Fatalf("watch of %s from position %d, before the renewals: %v", prefix, from, stream.Err())
		}
		return stream.Msg().Events
	}
	if evs := watch("billing/"); len(evs) != 1 || evs[0].Kind != fencev1.EventKind_EVENT_KIND_GRANTED || evs[0].Token != billing.Token {
		t.Errorf("billing/ from before the renewals: %v; want billing/a granted with token %d", evs, billing.Token)
	}
	kinds := map[fencev1.EventKind]int{}
	for _, e := range watch("orders/") {
		kinds[e.Kind]++
	}
	if n := kinds[fencev1.EventKind_EVENT_KIND_RENEWED]; n < 1 || n > batches {
		t.Errorf("%d renewals of orders/a recorded in %d batches of %d; want 1 to %d", n, batches, maxRenewBatch, batches)
	}
	if n := kinds[fencev1.EventKind_EVENT_KIND_LOST]; n != 1 {
		t.Errorf("%d losses of orders/a recorded in %d batches of %d renewals answered lost; want 1", n, batches, maxRenewBatch)
	}
}
