package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/fsm"
)

// TestWatchHeldIsPaged: the held leases a watch starts with come in pages
// of at most watchHeldPage, in scope order, each lease once, every page
// resuming at the start position; the events follow.
func TestWatchHeldIsPaged(t *testing.T) {
	s := startWith(t, func(*Config) {})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 2*watchHeldPage + 10
	for i := range n {
		c := fsm.Command{Op: fsm.OpAcquire, Scope: fmt.Sprintf("p/%05d", i), LeaseID: fence.NewLeaseID(), Holder: "h", TTL: time.Minute, At: time.Now().UnixNano()}
		if _, err := s.node.Apply(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	rpc := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr())
	stream, err := rpc.Watch(ctx, connect.NewRequest(&fencev1.WatchRequest{Prefix: "p/", IncludeHeld: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var (
		seen  int
		pages int
		start uint64
	)
	for seen < n && stream.Receive() {
		resp := stream.Msg()
		pages++
		if len(resp.Events) > watchHeldPage {
			t.Errorf("page %d has %d events, more than %d", pages, len(resp.Events), watchHeldPage)
		}
		if pages == 1 {
			start = resp.NextPosition
		} else if resp.NextPosition != start {
			t.Errorf("page %d resumes at %d, want the start position %d", pages, resp.NextPosition, start)
		}
		for _, e := range resp.Events {
			if want := fmt.Sprintf("p/%05d", seen); e.Kind != fencev1.EventKind_EVENT_KIND_HELD || e.Scope != want {
				t.Fatalf("held event %d: %v %q; want held %q", seen, e.Kind, e.Scope, want)
			}
			seen++
		}
	}
	if seen != n || pages != 3 {
		t.Fatalf("%d held leases in %d responses (%v); want %d in 3", seen, pages, stream.Err(), n)
	}
	if _, err := s.node.Apply(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: "p/new", LeaseID: fence.NewLeaseID(), Holder: "h", TTL: time.Minute, At: time.Now().UnixNano()}); err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || len(stream.Msg().Events) != 1 || stream.Msg().Events[0].Scope != "p/new" {
		t.Fatalf("after the held leases: %v, %v; want the grant of p/new", stream.Msg(), stream.Err())
	}
}
