package server

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/wire"
)

// TestAcquireAndReleaseBatch: each item of a batch is answered on its own,
// in the request's order, as the single call would answer it: a refused
// item (held, malformed, waiting) leaves the others granted or released.
func TestAcquireAndReleaseBatch(t *testing.T) {
	s := startWith(t, func(c *Config) { c.NoClockFloor = true })
	rpc := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr())
	ctx := context.Background()
	minute := durationpb.New(time.Minute)
	resp, err := rpc.AcquireBatch(ctx, connect.NewRequest(&fencev1.AcquireBatchRequest{Acquires: []*fencev1.AcquireRequest{
		{Scope: "a", Holder: "h1", Ttl: minute},
		{Scope: "a", Holder: "h2", Ttl: minute},                          // held by the first
		{Scope: "b", Holder: "h3", Ttl: durationpb.New(time.Nanosecond)}, // malformed
		{Scope: "c", Holder: "h4", Ttl: minute, Wait: true},              // waits go alone
		{Scope: "d", Holder: "h5", Ttl: minute, RequestId: "r5"},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	got := resp.Msg.Results
	if len(got) != 5 {
		t.Fatalf("%d results, want 5", len(got))
	}
	a, d := got[0].GetLease(), got[4].GetLease()
	if a.GetScope() != "a" || a.GetHolder() != "h1" || a.GetToken() != 1 || d.GetScope() != "d" || d.GetHolder() != "h5" || d.GetToken() != 1 {
		t.Fatalf("grants %v and %v; want a for h1 and d for h5, token 1 each", got[0], got[4])
	}
	var held *fence.HeldError
	if err := wire.FromFailure(got[1].Failure); got[1].Lease != nil || !errors.As(err, &held) || held.Holder != "h1" || held.Token != 1 {
		t.Errorf("second acquire of a: %v, %v; want held by h1 with token 1", got[1], err)
	}
	var inv *fence.InvalidError
	if err := wire.FromFailure(got[2].Failure); !errors.As(err, &inv) || inv.Field != "ttl" {
		t.Errorf("acquire with a 1ns TTL: %v; want invalid ttl", err)
	}
	if err := wire.FromFailure(got[3].Failure); !errors.As(err, &inv) || inv.Field != "wait" {
		t.Errorf("waiting acquire in a batch: %v; want invalid wait", err)
	}
	// A retry of the batch gets the grant the request ID names again.
	again, err := rpc.AcquireBatch(ctx, connect.NewRequest(&fencev1.AcquireBatchRequest{Acquires: []*fencev1.AcquireRequest{
		{Scope: "d", Holder: "h5", Ttl: minute, RequestId: "r5"},
	}}))
	if err != nil || again.Msg.Results[0].GetLease().GetLeaseId() != d.LeaseId {
		t.Errorf("retried acquire of d: %v, %v; want the grant %s again", again, err, d.LeaseId)
	}

	rel, err := rpc.ReleaseBatch(ctx, connect.NewRequest(&fencev1.ReleaseBatchRequest{Releases: []*fencev1.ReleaseRequest{
		{Scope: "a", LeaseId: a.LeaseId},
		{Scope: "d", LeaseId: fence.NewLeaseID().String()},
		{Scope: "d", LeaseId: d.LeaseId},
		{Scope: "a", LeaseId: a.LeaseId}, // released just before, in the same entry
	}}))
	if err != nil {
		t.Fatal(err)
	}
	r := rel.Msg.Results
	if len(r) != 4 || r[0].Failure != nil || r[0].Token != 1 || r[2].Failure != nil || r[2].Token != 1 {
		t.Fatalf("releases %v; want a and d released, token 1 each", r)
	}
	if err := wire.FromFailure(r[1].Failure); !errors.Is(err, fence.ErrNotHolder) {
		t.Errorf("release of d with another ID: %v; want not the holder", err)
	}
	if err := wire.FromFailure(r[3].Failure); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("second release of a: %v; want lost", err)
	}
	for _, scope := range []string{"a", "d"} {
		if g, err := rpc.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: scope})); err != nil || g.Msg.Lease != nil || g.Msg.LastToken != 2 {
			t.Errorf("%s after the batches: %v, %v; want free, last token 2 (its closing)", scope, g, err)
		}
	}

	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"no acquire", func() error {
			_, err := rpc.AcquireBatch(ctx, connect.NewRequest(&fencev1.AcquireBatchRequest{}))
			return err
		}},
		{"1001 releases", func() error {
			_, err := rpc.ReleaseBatch(ctx, connect.NewRequest(&fencev1.ReleaseBatchRequest{Releases: make([]*fencev1.ReleaseRequest, 1001)}))
			return err
		}},
	} {
		if err := tc.call(); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: %v; want invalid_argument for the whole call", tc.name, err)
		}
	}
}

// TestInParallelCallsEachIndexOnce: the batch answers are filled in on
// several goroutines; each index must be filled exactly once, whatever n.
func TestInParallelCallsEachIndexOnce(t *testing.T) {
	for _, n := range []int{0, 1, 3, 4, 7, 8, 9, 100, 1000} {
		calls := make([]atomic.Int32, n)
		inParallel(n, func(i int) { calls[i].Add(1) })
		for i := range calls {
			if c := calls[i].Load(); c != 1 {
				t.Errorf("n=%d: index %d called %d times; want once", n, i, c)
			}
		}
	}
}
