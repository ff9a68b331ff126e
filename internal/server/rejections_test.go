package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/eventlog"
	"github.com/fence-dev/fence/internal/scrape"
)

// TestRejectionsLeaveTheRingToOthers: eleven reports of one stale token
// refused a thousand times record one rejection, and eleven reports of a
// thousand rejections each of its own scope and token, which pushed every
// other scope's grants out of the leader's ring of 10,000 events, record a
// tenth of the ring at most. A watch of another prefix still resumes from a
// position before them all and finds its grant there; the metrics count
// every rejection reported, and the status page every one of a scope.
func TestRejectionsLeaveTheRingToOthers(t *testing.T) {
	s := startWith(t, func(*Config) {})
	rpc := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	from := s.events.Position(s.node.Term())
	r, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "billing/a", Holder: "billing", Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	billing := r.Msg.Lease
	const batches = 11
	report := func(rejection func(i int) *fencev1.Rejection) {
		t.Helper()
		for b := range batches {
			rs := make([]*fencev1.Rejection, maxReport)
			for i := range rs {
				rs[i] = rejection(b*maxReport + i)
			}
			if _, err := rpc.ReportRejections(ctx, connect.NewRequest(&fencev1.ReportRejectionsRequest{Guard: "orders-db", Rejections: rs})); err != nil {
				t.Fatal(err)
			}
		}
	}
	report(func(int) *fencev1.Rejection {
		return &fencev1.Rejection{Scope: "orders/a", PresentedToken: 1, HighestToken: 2}
	})
	counted := func(scope string, want uint64) {
		t.Helper()
		counts, _, _ := s.rejected.Summary(time.Now())
		var got uint64
		for _, c := range counts {
			if c.Scope == scope {
				got = c.Count
			}
		}
		if got != want {
			t.Errorf("the status page counts %d rejections of %s, want %d", got, scope, want)
		}
	}
	counted("orders/a", batches*maxReport)
	report(func(i int) *fencev1.Rejection {
		return &fencev1.Rejection{Scope: fmt.Sprint("orders/", i%maxReport), PresentedToken: uint64(10 + i), HighestToken: 1 << 40}
	})

	stream, err := rpc.Watch(ctx, connect.NewRequest(&fencev1.WatchRequest{Prefix: "billing/", StartPosition: from}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		t.Fatalf("watch of billing/ from position %d, before the rejections: %v", from, stream.Err())
	}
	if evs := stream.Msg().Events; len(evs) != 1 || evs[0].Kind != fencev1.EventKind_EVENT_KIND_GRANTED || evs[0].Token != billing.Token {
		t.Errorf("billing/ from before the rejections: %v; want billing/a granted with token %d", evs, billing.Token)
	}

	var same, all int
	for _, e := range s.events.Recent("orders/", eventlog.RingSize, nil) {
		if e.Kind == eventlog.Rejected {
			all++
			if e.Scope == "orders/a" && e.Token == 1 {
				same++
			}
		}
	}
	if same != 1 || all < 1 || all > eventlog.RingSize/10 {
		t.Errorf("%d rejections of orders/a's token 1 and %d in all recorded of %d reported; want 1, and a tenth of the ring at most",
			same, all, 2*batches*maxReport)
	}
	if got, _ := scrape.Find(scrape.Families(t, s.Addr()), "fence_stale_rejections_reported_total"); got != 2*batches*maxReport {
		t.Errorf("fence_stale_rejections_reported_total = %v, want %d", got, 2*batches*maxReport)
	}
	counted("orders/7", batches)
}
