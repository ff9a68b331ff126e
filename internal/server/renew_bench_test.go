package server

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
)

// BenchmarkRenewBatch calls the RenewBatch handler, without HTTP, the way
// the peers' renew workload does: 10,000 leases held, 100 renewals a call.
// Each op is one call; divide by 100 for a renewal.
func BenchmarkRenewBatch(b *testing.B) {
	const leases, perCall = 10_000, 100
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Listen = b.TempDir(), "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := Start(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(context.Background())
	for deadline := time.Now().Add(20 * time.Second); !s.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("not ready")
		}
	}
	ctx := context.Background()
	held := make([]*fencev1.RenewRequest, 0, leases)
	for len(held) < leases {
		as := make([]*fencev1.AcquireRequest, maxBatch)
		for i := range as {
			as[i] = &fencev1.AcquireRequest{Scope: fmt.Sprintf("renew/%d", len(held)+i), Holder: "h", Ttl: durationpb.New(2 * time.Minute)}
		}
		resp, err := s.AcquireBatch(ctx, connect.NewRequest(&fencev1.AcquireBatchRequest{Acquires: as}))
		if err != nil {
			b.Fatal(err)
		}
		for i, r := range resp.Msg.Results {
			if r.Failure != nil {
				b.Fatalf("acquire %s: %v", as[i].Scope, r.Failure)
			}
			held = append(held, &fencev1.RenewRequest{Scope: r.Lease.Scope, LeaseId: r.Lease.LeaseId})
		}
	}
	// Strided, as the workload's workers renew: no two neighbours in a call.
	var reqs []*connect.Request[fencev1.RenewBatchRequest]
	const stride = leases / perCall
	for start := range stride {
		m := &fencev1.RenewBatchRequest{}
		for i := start; i < leases; i += stride {
			m.Renewals = append(m.Renewals, held[i])
		}
		reqs = append(reqs, connect.NewRequest(m))
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		resp, err := s.RenewBatch(ctx, reqs[i%len(reqs)])
		if err != nil {
			b.Fatal(err)
		}
		if f := resp.Msg.Results[0].Failure; f != nil {
			b.Fatal(f)
		}
	}
}
