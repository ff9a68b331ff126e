package client

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// heldBatches holds the lease service's batch calls until open closes, and
// says when the first arrives.
type heldBatches struct {
	next  http.RoundTripper
	open  chan struct{}
	began chan struct{} // closed when the first batch call arrives
	once  sync.Once
}

func (h *heldBatches) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "Batch") {
		h.once.Do(func() { close(h.began) })
		<-h.open
	}
	return h.next.RoundTrip(r)
}

func (h *heldBatches) CloseIdleConnections() {
	h.next.(interface{ CloseIdleConnections() }).CloseIdleConnections()
}

// TestCallerLeavesWithItsContext: the caller whose goroutine found no call
// in flight, and so took the calls queued meanwhile along with its own,
// returns when its own context ends, with its context's error, while the
// batch is still out for the others; it never reports the answer that
// came after (issue 33, item 2). The caller queued with it, whose context
// lives on, gets its grant.
func TestCallerLeavesWithItsContext(t *testing.T) {
	s := StartServer(t, nil)
	h := &heldBatches{next: http.DefaultTransport.(*http.Transport).Clone(), open: make(chan struct{}), began: make(chan struct{})}
	c, err := New(s.Addr(), WithHTTPClient(&http.Client{Transport: h}), WithHolder("coalesced"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	opened := sync.OnceFunc(func() { close(h.open) })
	defer opened()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// A call in flight, as far as the acquires know: the other's acquire
	// queues behind it, as one made while a caller yields does.
	b := c.acquires
	b.mu.Lock()
	b.running = true
	b.mu.Unlock()
	other := make(chan error, 1)
	go func() {
		_, err := c.Grant(ctx, "co/other")
		other <- err
	}()
	for deadline := time.Now().Add(wait); ; time.Sleep(time.Millisecond) {
		b.mu.Lock()
		n := len(b.queue)
		b.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the other acquire did not queue within %v", wait)
		}
	}
	b.mu.Lock()
	b.running = false
	b.mu.Unlock()

	// This caller finds none in flight: its acquire goes with the other's,
	// as one AcquireBatch, which the service does not answer yet.
	mine, leave := context.WithCancel(ctx)
	defer leave()
	returned := make(chan error, 1)
	go func() {
		_, err := c.Grant(mine, "co/mine")
		returned <- err
	}()
	select {
	case <-h.began:
	case <-time.After(wait):
		t.Fatalf("no AcquireBatch call within %v", wait)
	}
	leave()
	select {
	case err := <-returned:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Grant after its context was cancelled = %v, want context.Canceled", err)
		}
	case <-time.After(wait):
		opened()
		t.Fatalf("Grant did not return within %v of its context's end; once the batch was answered it returned %v", wait, <-returned)
	}
	opened()
	select {
	case err := <-other:
		if err != nil {
			t.Errorf("the other acquire, whose context lives on: %v", err)
		}
	case <-time.After(wait):
		t.Fatalf("the other acquire did not return within %v of the answer", wait)
	}
}
