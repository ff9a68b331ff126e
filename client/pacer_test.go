package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
)

// TestPacerPausesStayShort: the pauses between a call's attempts grow from
// 20ms and never pass 100ms, however long the service stays
// unavailable, so a call finds a new leader soon after it serves.
func TestPacerPausesStayShort(t *testing.T) {
	var p pacer
	backoff := 20 * time.Millisecond
	for i := range 100 {
		d := p.next(false, 3)
		limit := backoff + time.Millisecond
		backoff = min(2*backoff, 100*time.Millisecond) // as the docs say
		if d <= 0 || d > limit {
			t.Fatalf("pause %d: %v; want above 0 and at most %v", i+1, d, limit)
		}
	}
}

// TestPacerPassesOverRefusedNodes: after a refused connection the next
// node is tried at once, once around the list at most: with every node
// down, each round of them ends in a pause. A node that answered is
// followed by a pause whatever came before.
func TestPacerPassesOverRefusedNodes(t *testing.T) {
	var p pacer
	for round := range 3 {
		for i, refused := range []bool{true, true, true} {
			d := p.next(refused, 3)
			if last := i == 2; (d == 0) == last {
				t.Fatalf("round %d, node %d refused: pause %v; want none but after the third", round, i+1, d)
			}
		}
	}
	if d := p.next(true, 3); d != 0 {
		t.Fatalf("refused after a pause: pause %v, want none", d)
	}
	if d := p.next(false, 3); d == 0 {
		t.Fatal("a node that answered unavailable: no pause")
	}
	if d := p.next(true, 1); d == 0 {
		t.Fatal("the only node refused: no pause")
	}
}

// TestAttemptTellsRefusedConnections: an attempt at an address where
// nothing listens says that the connection was refused; one at a node that
// answers "unavailable" does not.
func TestAttemptTellsRefusedConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		connect.NewErrorWriter().Write(w, r, connect.NewError(connect.CodeUnavailable, errors.New("no leader")))
	}))
	defer busy.Close()

	c, err := New(dead+","+busy.URL, WithRetryTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	get := func(ctx context.Context, s *service) (*connect.Response[fencev1.GetResponse], error) {
		return s.lease.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: "s"}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for i, want := range []bool{true, false} {
		_, refused, err := attempt(ctx, c, &c.nodes[i], get)
		if !errors.Is(err, fence.ErrUnavailable) || refused != want {
			t.Errorf("node %d: refused %v, err %v; want refused %v and unavailable", i+1, refused, err, want)
		}
	}
}

// TestPacerPauseKeepsToTheBudget: a pause that would end past the call's
// retry budget is not taken, nor one whose context ends; a refused node
// is passed over at once, within the budget.
func TestPacerPauseKeepsToTheBudget(t *testing.T) {
	ctx := context.Background()
	var p pacer
	if p.pause(ctx, time.Now(), false, 3) {
		t.Error("a pause past the budget was taken")
	}
	if !p.pause(ctx, time.Now().Add(time.Hour), true, 3) {
		t.Error("a refused node within the budget was not passed over")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if p.pause(cancelled, time.Now().Add(time.Hour), false, 3) {
		t.Error("a pause whose context ended was taken")
	}
}
